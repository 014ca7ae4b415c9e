"""Redis adapter of the record view.

Keys live under a generation namespace `ml:g<N>:`, and `ml:generation` points at the one
readers use, so a rebuild can fill a new generation and switch over atomically
(`record_view_generations`). Every key of an agent carries the agent as a hash tag,
`{<tenant>/<agent>}`, so an agent's keys share one Redis Cluster slot and one script or
MULTI/EXEC may touch them all (`record_view_keys`; docs/operations/redis-cluster.md).
An agent's records share one hash, `rec:{<tenant>/<agent>}`: field `<record id>` holds the
current version and `<record id>#<version>` each version; per-record keys cost Redis a key
each to create, and dropping a generation had to scan and unlink every one. Besides the
agent's listing `list:{<agent>}`, each member has a listing of their USER records,
`ulist:{<agent>}|<user>`, and `users:{<agent>}` names the members who have (had) any: a
member's list and an operator's counts read those, not the agent's whole listing. Expiring
records are in each agent's `expiry:{<agent>}`, and `expiring` names the agents that have
(had) any. A generation written in an older layout (without hash tags, with per-record keys,
or without member listings) reads as empty or misses records: `memlane rebuild` fills a new
generation, which has them all.

Events fold through one table (`record_view_fold`): the live path applies each agent's
records with one versioned script (`record_view_apply`), a rebuild's fill with plain
commands (`record_view_fill`). `SubjectErased` and `RecordsPurged` drop what they name
(`record_view_purge`); a batch is applied up to each of them, then the purge, then on
(`record_view_write`).

No plaintext: a version is stored as the event's raw bytes, its personal fields sealed
(`events.sealing`), and a block's text sealed under its agent's key (`record_view_stored`);
reads open them, skipping what was sealed under a destroyed key (`record_view_reads`). A
record sealed under a key that is destroyed already is not stored at all.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from events.codec import PLAIN, Codec
from projections.records import Keys
from projections.redis.applied_waiter import AppliedListener
from projections.redis.record_view_generations import Generations
from projections.redis.record_view_keys import AGENT_KINDS, APPLY_KINDS, agent_key, apply_keys, user_list_key
from projections.redis.record_view_reads import RecordReads
from projections.redis.record_view_scripts import APPLY, CHECKPOINT
from projections.redis.record_view_write import RecordWriter

__all__ = ["AGENT_KINDS", "APPLY", "APPLY_KINDS", "CHECKPOINT", "RedisRecords", "agent_key", "apply_keys",
           "user_list_key"]


class RedisRecords(RecordReads):
    """The record view: its reads (`RecordReads`), the writes that fold the log into it
    (`RecordWriter`) and its generations (`Generations`)."""

    def __init__(
        self, client: aioredis.Redis, generation: int | None = None, namespace: str = "", announce: bool = False,
        keys: Keys | None = None, codec: Codec = PLAIN,
    ) -> None:
        # Deployments sharing one Redis (tests, demos) keep apart by namespace.
        self.root = f"ml:{namespace}"
        super().__init__(client, Generations(client, self.root, generation), keys, codec)
        # `apply` publishes what it applied here: the live worker's writes, which API
        # requests wait for (`AppliedListener`). Rebuilds and replays have no one waiting.
        self.applied_channel = f"{self.root}applied"
        self.announce = announce
        self._listener: AppliedListener | None = None
        self._writer = RecordWriter(self, self.gens)

    @property
    def fixed_generation(self) -> int | None:
        return self.gens.fixed

    def applied(self) -> AppliedListener:
        """This process's one subscription to what the view's worker applies."""
        if self._listener is None:
            self._listener = AppliedListener(self.r, self.applied_channel)
        return self._listener

    # ------------------------------------------------------------------ generations

    async def generation(self) -> int:
        """The generation writes go to, looked up every time."""
        return await self.gens.current()

    async def switch_generation(self, gen: int) -> None:
        await self.gens.switch(gen)

    async def generations(self) -> list[int]:
        """Generations that hold events, ascending."""
        return await self.gens.held()

    async def drop_generation(self, gen: int) -> int:
        """Delete a generation's keys; the number deleted."""
        return await self.gens.drop(gen)

    async def checkpoints(self, gen: int | None = None) -> dict[str, int]:
        return await self.gens.checkpoints(gen)

    # ------------------------------------------------------------------ writes

    async def apply(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """Apply events; `positions[i]` is the (topic:partition, next offset) checkpoint of event i.

        The view and its checkpoints change in one script call: either both or neither. A
        batch with purges is applied up to each, then the purge, and the checkpoint moves
        with its last part: a crash in between applies it all again, which changes nothing.
        """
        await self._writer.apply(events, positions)

    async def fill(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """`apply` for a generation that this process alone fills, in log order, for the
        agents it folds (a rebuild's shard): plain commands, no script, and the checkpoint
        after the view's writes (`record_view_fill`)."""
        await self._writer.fill(events, positions)

    async def purge(self, ns: str, e: Any) -> None:
        """Drops what a `SubjectErased` or a `RecordsPurged` names from generation namespace
        `ns`. Idempotent."""
        await self._writer.purge(ns, e)

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
        await self.r.aclose()
