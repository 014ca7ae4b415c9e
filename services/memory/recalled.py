"""Which record versions a conversation's recalls showed already, so a recall offers each version once.

Each shown version remembers the request that showed it first: the same request sent again
(a client retrying on another replica after the first one died mid-answer) is shown what the
first attempt showed, not an empty block."""

from __future__ import annotations

import uuid

from events.record import MemoryRecord
from projections.redis_records import RedisRecords

RECALLED_TTL_S = 7 * 24 * 3600


class RecalledVersions:
    def __init__(self, records: RedisRecords) -> None:
        self.view = records  # its Redis client and key root, which this set shares

    def _key(self, tenant: str, agent: str, conversation: str) -> str:
        return f"{self.view.root}shown:{tenant}/{agent}:{conversation}"

    async def shown(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord],
                    request: str | None = None) -> list[bool]:
        """For each record, whether this version was recalled in the conversation before, by
        another request than `request`."""
        got = await self.view.r.hmget(self._key(tenant, agent, conversation), [f"{r.id}:{r.version}" for r in records])
        return [by is not None and by != request for by in got]

    async def mark(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord],
                   request: str | None = None) -> None:
        key, by = self._key(tenant, agent, conversation), request or uuid.uuid4().hex
        pipe = self.view.r.pipeline(transaction=False)
        for r in records:
            pipe.hsetnx(key, f"{r.id}:{r.version}", by)  # the first request to show a version keeps it
        pipe.expire(key, RECALLED_TTL_S)
        await pipe.execute()

