"""Which record versions a conversation's recalls showed already, so a recall offers each version once."""

from __future__ import annotations

from events.record import MemoryRecord
from projections.redis_records import RedisRecords

RECALLED_TTL_S = 7 * 24 * 3600


class RecalledVersions:
    def __init__(self, records: RedisRecords) -> None:
        self.view = records  # its Redis client and key root, which this set shares

    def _key(self, tenant: str, agent: str, conversation: str) -> str:
        return f"{self.view.root}recalled:{tenant}/{agent}:{conversation}"

    async def shown(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord]) -> list[bool]:
        """For each record, whether this version was recalled in the conversation before."""
        key = self._key(tenant, agent, conversation)
        return await self.view.r.smismember(key, [f"{r.id}:{r.version}" for r in records])

    async def mark(self, tenant: str, agent: str, conversation: str, records: list[MemoryRecord]) -> None:
        key = self._key(tenant, agent, conversation)
        await self.view.r.sadd(key, *[f"{r.id}:{r.version}" for r in records])
        await self.view.r.expire(key, RECALLED_TTL_S)
