"""Reads of memory as it stood at a past point (`as_of`), and of the facts that held in the world at
a time (`valid_at`).

A past read goes through the same rules as a read of now: only the records it reads (and the
agent's own blocks) come from the fold of the log up to the point (`workers.followers.past_memory`),
and a ranked search goes to an index of the records live then (`workers.followers.past_index`). Who
may read, and whether the agent or member is removed or without consent, is decided as of now: a
withdrawn consent or a removal hides the past too."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from events.record import MemoryRecord
from projections.records import MemoryFold, Page


class PastView:
    """The record view as of a point: records, their versions and preview shadows from `fold`,
    everything else (configuration, consent, removals, blocks) from the live view."""

    def __init__(self, now: Any, fold: MemoryFold, agent: tuple[str, str]) -> None:
        self.now = now
        self.fold = fold
        self.agent = agent  # (tenant, agent) whose log `fold` is

    def __getattr__(self, name: str) -> Any:
        return getattr(self.now, name)

    async def page(self, tenant: str, agent: str, limit: int, after: str | None = None, ascending: bool = False,
                   user: str | None = None) -> Page:
        return await self.fold.page(tenant, agent, limit, after, ascending=ascending, user=user)

    async def get(self, tenant: str, agent: str, rid: str, version: int | None = None) -> MemoryRecord | None:
        return await self.fold.get(tenant, agent, rid, version)

    async def get_many(self, tenant: str, agent: str, rids: list[str]) -> list[MemoryRecord]:
        got = [await self.fold.get(tenant, agent, rid) for rid in rids]
        return [r for r in got if r is not None]

    async def pinned(self, tenant: str, agent: str) -> list[MemoryRecord]:
        return await self.fold.pinned(tenant, agent)

    async def blocks(self, tenant: str, agent: str) -> dict[str, str]:
        """The agent's own blocks as they stood; its workspace's are read as they are now (the
        fold is of this agent's log only)."""
        if (tenant, agent) == self.agent:
            return await self.fold.blocks(tenant, agent)
        return await self.now.blocks(tenant, agent)

    async def history(self, tenant: str, agent: str, rid: str) -> list[MemoryRecord]:
        return await self.fold.history(tenant, agent, rid)

    async def shadowed(self, tenant: str, agent: str) -> set[str]:
        return await self.fold.shadowed(tenant, agent)

    async def census(self, tenant: str, agent: str) -> dict[tuple[str, str, str], int]:
        """How many of the agent's records were in each (status, kind, scope) at the point."""
        counts: dict[tuple[str, str, str], int] = {}
        for (t, a, rid), v in self.fold.current.items():
            if (t, a) == (tenant, agent):
                r = self.fold.versions[(t, a, rid)][v]
                k = (r.status.value, r.kind, r.scope.value)
                counts[k] = counts.get(k, 0) + 1
        return counts


def holds_at(r: MemoryRecord, at: datetime) -> bool:
    """Whether a fact held in the world at `at`: from its `valid_from` (open when unset) until its
    `valid_to` (open when unset; the fact no longer holds from that moment)."""
    return (r.valid_from is None or r.valid_from <= at) and (r.valid_to is None or at < r.valid_to)
