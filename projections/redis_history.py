"""Redis side of session history: kept events by id, and each session's order.

Per session (`tenant/agent/session`): a hash of event id -> whole event, and a sorted
set ordered by turn then sequence, for listing without a query and for paging. The
projection's checkpoints live in the same namespace and change in the same MULTI/EXEC
as the events they cover, so a restart resumes exactly where the view stands.
Folding the same turn twice writes the same values: replays and redeliveries are safe.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from events.rules.history import SEQ_SLOTS, HistoryFilter, KeptEvent


class RedisHistory:
    def __init__(self, client: aioredis.Redis, namespace: str = "", generation: int = 1) -> None:
        self.r = client
        self.ns = f"ml:{namespace}hist:g{generation}"

    @classmethod
    def from_url(cls, url: str, namespace: str = "", generation: int = 1) -> RedisHistory:
        return cls(aioredis.from_url(url, decode_responses=True), namespace, generation)

    def _ev(self, session_key: str) -> str:
        return f"{self.ns}:ev:{session_key}"

    def _ord(self, session_key: str) -> str:
        return f"{self.ns}:ord:{session_key}"

    # ------------------------------------------------------------------ write side

    async def apply(self, events: list[KeptEvent], checkpoints: dict[str, int]) -> None:
        async with self.r.pipeline(transaction=True) as p:
            for e in events:
                p.hset(self._ev(e.session_key), e.id, e.to_json())
                p.zadd(self._ord(e.session_key), {e.id: e.order})
            if checkpoints:
                p.hset(f"{self.ns}:ckpt", mapping=checkpoints)
            await p.execute()

    async def checkpoints(self) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.r.hgetall(f"{self.ns}:ckpt")).items()}

    # ------------------------------------------------------------------ read side

    async def get_many(self, tenant: str, agent: str, session: str, ids: list[str]) -> list[KeptEvent]:
        if not ids:
            return []
        raw = await self.r.hmget(self._ev(f"{tenant}/{agent}/{session}"), ids)
        return [KeptEvent.from_json(x) for x in raw if x]

    async def page(
        self, f: HistoryFilter, limit: int, after: tuple[int, str] | None = None
    ) -> tuple[list[KeptEvent], tuple[int, str] | None]:
        """Newest first, after `after` (the (order, id) of the last event of the previous page)."""
        sk = f"{f.tenant}/{f.agent}/{f.session}"
        top = float("inf")
        if f.before_turn is not None:
            top = f.before_turn * SEQ_SLOTS - 1
        if after is not None:
            top = min(top, after[0])
        out: list[KeptEvent] = []
        offset, chunk = 0, max(limit * 4, 64)
        while len(out) <= limit:
            rows = await self.r.zrevrangebyscore(self._ord(sk), top, "-inf", start=offset, num=chunk, withscores=True)
            if not rows:
                break
            offset += len(rows)
            # Equal positions come in reverse id order; skip what the previous page returned.
            ids = [rid for rid, sc in rows if after is None or (int(sc), rid) < after]
            events = await self.get_many(f.tenant, f.agent, f.session, ids)
            out.extend(e for e in events if f.admits(e))
        more, out = len(out) > limit, out[:limit]
        return out, ((out[-1].order, out[-1].id) if more else None)

    async def aclose(self) -> None:
        await self.r.aclose()
