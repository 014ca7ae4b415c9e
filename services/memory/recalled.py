"""Which record versions a conversation's recalls showed already, so a recall offers each version once.

Each shown version remembers the request that showed it first: the same request sent again
(a client retrying on another replica after the first one died mid-answer) is shown what the
first attempt showed, not an empty block, and its records' use is not counted again."""

from __future__ import annotations

from typing import cast

from events.record import MemoryRecord
from projections.redis.record_view import RedisRecords

RECALLED_TTL_S = 7 * 24 * 3600
SAME, OTHER = "same", "other"  # who showed a version before: this request, or another


def shown_by(first: str | None, request: str | None) -> str | None:
    """How a version was shown before, given the request that first showed it: `None` never,
    `SAME` by this request (a retry), `OTHER` by another ("" is no request: it matches none)."""
    return None if first is None else SAME if request is not None and first == request else OTHER


class RecalledVersions:
    def __init__(self, records: RedisRecords) -> None:
        self.view = records  # its Redis client and key root, which this set shares

    def _key(self, tenant: str, agent: str, conversation: str) -> str:
        return f"{self.view.root}shown:{tenant}/{agent}:{conversation}"

    async def shown(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord],
                    request: str | None = None) -> list[str | None]:
        """For each record, how this version was recalled in the conversation before: `None`
        never, `SAME` by this request (a retry), `OTHER` by another."""
        got = await self.view.r.hmget(self._key(tenant, agent, conversation), [f"{r.id}:{r.version}" for r in records])
        # The view's client decodes responses, so each field is a str or None.
        return [shown_by(cast("str | None", by), request) for by in got]

    async def mark(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord],
                   request: str | None = None) -> None:
        key = self._key(tenant, agent, conversation)
        pipe = self.view.r.pipeline(transaction=False)
        for r in records:
            # The first request to show a version keeps it; "" (no request) matches none.
            pipe.hsetnx(key, f"{r.id}:{r.version}", request or "")
        pipe.expire(key, RECALLED_TTL_S)
        await pipe.execute()
