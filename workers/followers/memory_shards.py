"""The memory index of a generation: one Edge shard, and its projection, per shard of agents.

Agents are split by the event partition they are written to, so each shard's projection
reads only its own partitions of the log, and a rebuild folds the shards in parallel
processes. A search or a read-your-writes wait goes to its agent's shard; no query spans
two agents, so none spans two shards.

Where a generation's shards live, embedded Edge shards or a Qdrant server's collections, is
the `IndexGenerations` the composition root passes in (`projections.qdrant.generations`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from events.codec import Codec
from events.topics import EVENTS
from projections.embedders.port import Embedder
from projections.qdrant.generations import IndexGenerations
from projections.qdrant.index import Hit, Mode, SearchFilter
from projections.redis.connection import Connect
from settings import Settings
from workers.followers.qdrant_projection import VECTOR_CACHE, QdrantProjection
from workers.followers.reconciler import Reconciler
from workers.runtime.follower_poison import FollowerPoison
from workers.runtime.tracing import NO_TRACING, Tracing


def shard_of(tenant: str, agent: str, shards: int) -> int:
    """The shard of an agent: the one that owns the event partition its events go to
    (events are keyed by agent, so co-partitioned with its commands)."""
    return EVENTS.partition_of(f"{tenant}/{agent}".encode()) % shards


def shard_partitions(shard: int, shards: int) -> list[int]:
    return [p for p in range(EVENTS.partitions) if p % shards == shard]


class MemoryShards:
    """Routes by agent to the shards of one generation; searchable like one `EdgeIndex`.

    Searches go to the generation's collections by name, not through the aliases: between a
    rebuild's alias swap and this process's own swap, the alias names a generation whose
    projection this process does not run yet, so a write it reported searchable would not be."""

    def __init__(self, settings: Settings, generations: IndexGenerations, generation: int, redis: Connect,
                 embedder: Embedder | None = None, keys: Any = None, *, codec: Codec,
                 tracing: Tracing = NO_TRACING) -> None:
        self.settings = settings
        self.codec = codec
        self.generation = generation
        self.keys = keys  # the process's data keys (workers.runtime.data_keys.KeyTopic), or None
        n = generations.count(generation)
        generations.begin(generation)
        # The process's vector cache is shared among its shards, not one per shard.
        # ... and so is the producer that parks what breaks the contract.
        self.poison = FollowerPoison(settings, "memory-index", codec)
        self.projections = [
            QdrantProjection(settings, generations.open(generation, k), shard_partitions(k, n),
                             vector_cache=VECTOR_CACHE // n, keys=keys, poison=self.poison, codec=codec,
                             tracing=tracing)
            for k in range(n)
        ]
        # An erasure of every agent of a tenant is in one shard's partitions and reaches all.
        for proj in self.projections:
            proj.peers = [other for other in self.projections if other is not proj]
        # The process's embedder, for points the reconciler heals whose vector is not cached
        # (without one, it heals only those whose vector is).
        self.embedder = embedder
        self.reconciler = Reconciler(settings, self, redis)

    def of(self, tenant: str, agent: str) -> QdrantProjection:
        return self.projections[shard_of(tenant, agent, len(self.projections))]

    def search(self, f: SearchFilter, dense: list[float] | None, text: str, limit: int,
               mode: Mode = "hybrid", min_score: float = 0.0, window: tuple[int, int] | None = None) -> list[Hit]:
        return self.of(f.tenant, f.agent).index.search(f, dense, text, limit, mode, min_score, window)

    def vectors(self, tenant: str, agent: str, ids: list[str]) -> dict[str, list[float]]:
        return self.of(tenant, agent).index.vectors(tenant, agent, ids)

    def wait_for(self, command_id: str, tenant: str, agent: str) -> asyncio.Future:
        return self.of(tenant, agent).wait_for(command_id, tenant, agent)

    def position(self, tenant: str, agent: str) -> tuple[int, int]:
        """The agent's event partition and the offset before which this process serves all of it."""
        partition = EVENTS.partition_of(f"{tenant}/{agent}".encode())
        return partition, self.of(tenant, agent).searchable_to(tenant, agent, partition)

    async def reach(self, tenant: str, agent: str, offset: int, timeout: float) -> bool:
        """Until this process serves the agent's events before `offset` (another replica's
        position), or `timeout` s: False then. Replicas follow the same log, so it is a
        matter of milliseconds unless this one is behind."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.position(tenant, agent)[1] < offset:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def run(self) -> None:
        reconciling = asyncio.create_task(self.reconciler.run(self.settings.reconcile_every_s, self.settings.reconcile_delay_s), name="reconciler")
        try:
            await asyncio.gather(*(p.run() for p in self.projections))
        finally:
            reconciling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciling
            await self.reconciler.aclose()
            await self.poison.aclose()

    async def caught_up(self) -> None:
        await asyncio.gather(*(p.caught_up.wait() for p in self.projections))

    async def drained(self, timeout: float) -> None:
        """Until no caller waits on these shards, or `timeout` s. Meanwhile they keep
        following the log, so a command sent just before a swap still resolves here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(p.waiters for p in self.projections) and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        for p in self.projections:
            p.stopping.set()

    def close(self) -> None:
        for p in self.projections:
            p.index.close()

    def status(self) -> dict[str, Any]:
        each = [p.status() for p in self.projections]
        return {
            "points": sum(s["points"] for s in each),
            "parked": sum(s["parked"] for s in each),
            "caught_up": all(s["caught_up"] for s in each),
            "applied": sum(s["applied"] for s in each),
            "unreadable": sum(s["unreadable"] for s in each),
            "shards": len(each),
            "reconciled": self.reconciler.status(),
        }
