"""The memory index of a generation: one Edge shard, and its projection, per shard of agents.

Agents are split by the event partition they are written to, so each shard's projection
reads only its own partitions of the log, and a rebuild folds the shards in parallel
processes. A search or a read-your-writes wait goes to its agent's shard; no query spans
two agents, so none spans two shards.

On disk: `qdrant/CURRENT` names the generation readers use; `qdrant/memory-g<N>/` holds
its shard count (`SHARDS`), the shards `s<k>/` and their checkpoints.

With a Qdrant server (`QDRANT_URL`, or qdrant-client's local mode) each shard of a generation
is a collection, the shard aliases name the generation readers use, and a generation's shard
count is how many collections it has (`projections.qdrant.client_index.Collections`); the
checkpoints stay in the data directory (docs/operations/qdrant-server.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from events.codec import Codec
from events.topics import EVENTS
from projections.embedders.port import Embedder
from projections.qdrant.index import EdgeIndex, Hit, Mode, SearchFilter
from projections.redis.connection import Connect
from settings import Settings
from workers.followers.qdrant_projection import VECTOR_CACHE, QdrantProjection
from workers.followers.reconciler import Reconciler
from workers.runtime.follower_poison import FollowerPoison

if TYPE_CHECKING:
    from projections.qdrant.client_index import ClientIndex, Collections


def qdrant_root(settings: Settings) -> Path:
    return Path(settings.data_dir) / "qdrant"


def collections_of(settings: Settings) -> Collections | None:
    """The server's (or local mode's) collections, or None for the embedded Edge shards."""
    if not settings.qdrant_client_mode:
        return None
    # Imported here: qdrant-client takes seconds to import, which an Edge deployment never needs.
    from projections.qdrant.client_index import Collections

    return Collections(settings.qdrant_url, settings.qdrant_collection_prefix, qdrant_root(settings) / "server",
                       local_root=settings.qdrant_local_path, api_key=settings.qdrant_api_key,
                       dim=settings.embedding_dim)


def current_generation(settings: Settings) -> int:
    if (cols := collections_of(settings)) is not None:
        return cols.live() or 1
    try:
        return int((qdrant_root(settings) / "CURRENT").read_text())
    except FileNotFoundError:
        return 1


def set_generation(settings: Settings, gen: int) -> None:
    root = qdrant_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / "CURRENT.tmp"
    tmp.write_text(str(gen))
    tmp.replace(root / "CURRENT")


def shard_of(tenant: str, agent: str, shards: int) -> int:
    """The shard of an agent: the one that owns the event partition its events go to
    (events are keyed by agent, so co-partitioned with its commands)."""
    return EVENTS.partition_of(f"{tenant}/{agent}".encode()) % shards


def shard_partitions(shard: int, shards: int) -> list[int]:
    return [p for p in range(EVENTS.partitions) if p % shards == shard]


def generation_path(settings: Settings, generation: int | None = None) -> Path:
    gen = current_generation(settings) if generation is None else generation
    return qdrant_root(settings) / f"memory-g{gen}"


def shard_paths(settings: Settings, generation: int | None = None) -> list[Path]:
    """The shard directories of a generation. A new generation takes the configured
    count and keeps it; one made before sharding (itself an Edge shard) is one shard."""
    root = generation_path(settings, generation)
    if (root / "edge_config.json").exists():
        return [root]
    count = root / "SHARDS"
    if not count.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / "SHARDS.tmp"
        tmp.write_text(str(settings.memory_shards))
        tmp.replace(count)
    return [root / f"s{k}" for k in range(int(count.read_text()))]


def shard_count(settings: Settings, generation: int) -> int:
    """A generation's shard count, made with the configured count if it has no shards yet."""
    if (cols := collections_of(settings)) is not None:
        return cols.ensure(generation, settings.memory_shards)
    return len(shard_paths(settings, generation))


def open_index(settings: Settings, generation: int, shard: int) -> EdgeIndex | ClientIndex:
    """Shard `shard` of a generation: its Edge shard, or its collection (see `shard_count`)."""
    if (cols := collections_of(settings)) is not None:
        return cols.open(generation, shard)
    return EdgeIndex(shard_paths(settings, generation)[shard])


def prepare_generation(settings: Settings, generation: int) -> int:
    """An empty generation with the configured shard count (a failed rebuild's leftovers
    gone); returns its shard count."""
    if (cols := collections_of(settings)) is not None:
        cols.drop(generation)
    else:
        shutil.rmtree(generation_path(settings, generation), ignore_errors=True)
    return shard_count(settings, generation)


def switch_to(settings: Settings, old: int, generation: int) -> None:
    """Readers move from `old` to `generation`. `serve` may still read `old` until it swaps,
    so only generations older than it go."""
    if (cols := collections_of(settings)) is not None:
        cols.switch(generation)
        for stale in sorted(g for g in cols.generations() if g < old):
            cols.drop(stale)
        return
    set_generation(settings, generation)
    for stale in range(1, old):
        shutil.rmtree(generation_path(settings, stale), ignore_errors=True)
        generation_path(settings, stale).with_name(f"memory-g{stale}.checkpoint.json").unlink(missing_ok=True)


class MemoryShards:
    """Routes by agent to the shards of one generation; searchable like one `EdgeIndex`.

    Searches go to the generation's collections by name, not through the aliases: between a
    rebuild's alias swap and this process's own swap, the alias names a generation whose
    projection this process does not run yet, so a write it reported searchable would not be."""

    def __init__(self, settings: Settings, generation: int, redis: Connect, embedder: Embedder | None = None,
                 keys: Any = None, *, codec: Codec) -> None:
        self.settings = settings
        self.codec = codec
        self.generation = generation
        self.keys = keys  # the process's data keys (workers.runtime.data_keys.KeyTopic), or None
        n = shard_count(settings, generation)
        if (cols := collections_of(settings)) is not None and cols.live() is None:
            cols.switch(generation)  # a new deployment: its first generation gets the aliases
        # The process's vector cache is shared among its shards, not one per shard.
        # ... and so is the producer that parks what breaks the contract.
        self.poison = FollowerPoison(settings, "memory-index", codec)
        self.projections = [
            QdrantProjection(settings, open_index(settings, generation, k), shard_partitions(k, n),
                             vector_cache=VECTOR_CACHE // n, keys=keys, poison=self.poison, codec=codec)
            for k in range(n)
        ]
        # An erasure of every agent of a tenant is in one shard's partitions and reaches all.
        for proj in self.projections:
            proj.peers = [other for other in self.projections if other is not proj]
        # The process's embedder, for points the reconciler heals whose vector is not cached
        # (it makes its own if none is given).
        self.embedder = embedder
        self.reconciler = Reconciler(settings, self, redis)

    def of(self, tenant: str, agent: str) -> QdrantProjection:
        return self.projections[shard_of(tenant, agent, len(self.projections))]

    def search(self, f: SearchFilter, dense: list[float] | None, text: str, limit: int,
               mode: Mode = "hybrid", min_score: float = 0.0) -> list[Hit]:
        return self.of(f.tenant, f.agent).index.search(f, dense, text, limit, mode, min_score)

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
