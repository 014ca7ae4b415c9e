"""Redis adapter of the record view.

Keys live under a generation namespace `ml:g<N>:`, and `ml:generation` points at the
one readers use, so a rebuild can fill a new generation and switch over atomically.
Each event is applied by one Lua script that checks the version and writes the view and
the projection's checkpoint together: the tracking record lives with the view.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from events.config import AgentConfig
from events.memory import RECORD_EVENTS, AgentConfigured
from events.record import MemoryRecord, Status
from projections.records import Page, decode_cursor, encode_cursor, listed, sort_score


# KEYS: record hash, listing zset, pinned zset, checkpoint hash
# ARGV: version, snapshot json, record id, sort score, listed 0/1, pinned 0/1, ckpt field, next offset
APPLY = """
redis.call('HSETNX', KEYS[1], 'v:' .. ARGV[1], ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], 'cur') or '0')
local applied = 0
if tonumber(ARGV[1]) > cur then
  redis.call('HSET', KEYS[1], 'cur', ARGV[1])
  if ARGV[5] == '1' then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3]) else redis.call('ZREM', KEYS[2], ARGV[3]) end
  if ARGV[6] == '1' then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3]) else redis.call('ZREM', KEYS[3], ARGV[3]) end
  applied = 1
end
if ARGV[7] ~= '' then
  local ck = tonumber(redis.call('HGET', KEYS[4], ARGV[7]) or '-1')
  if tonumber(ARGV[8]) > ck then redis.call('HSET', KEYS[4], ARGV[7], ARGV[8]) end
end
return applied
"""

CHECKPOINT = """
local ck = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > ck then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1
"""


class RedisRecords:
    def __init__(self, client: aioredis.Redis, generation: int | None = None, namespace: str = "") -> None:
        self.r = client
        self.fixed_generation = generation
        # Deployments sharing one Redis (tests, demos) keep apart by namespace.
        self.root = f"ml:{namespace}"
        self._apply = client.register_script(APPLY)
        self._checkpoint = client.register_script(CHECKPOINT)

    @classmethod
    def from_url(cls, url: str, generation: int | None = None, namespace: str = "") -> "RedisRecords":
        return cls(aioredis.from_url(url, decode_responses=True), generation, namespace)

    async def generation(self) -> int:
        if self.fixed_generation is not None:
            return self.fixed_generation
        g = await self.r.get(f"{self.root}generation")
        return int(g) if g else 1

    async def switch_generation(self, gen: int) -> None:
        await self.r.set(f"{self.root}generation", gen)

    def _ns(self, gen: int) -> str:
        return f"{self.root}g{gen}"

    def _keys(self, gen: int, tenant: str, agent: str, rid: str) -> list[str]:
        ns, ak = self._ns(gen), f"{tenant}/{agent}"
        return [f"{ns}:rec:{ak}:{rid}", f"{ns}:list:{ak}", f"{ns}:pinned:{ak}", f"{ns}:ckpt"]

    # ------------------------------------------------------------------ write side

    async def apply(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """Apply events; `positions[i]` is the (topic:partition, next offset) checkpoint of event i."""
        gen = await self.generation()
        async with self.r.pipeline(transaction=False) as pipe:
            for i, e in enumerate(events):
                field, nxt = positions[i] if positions else ("", 0)
                if isinstance(e, RECORD_EVENTS):
                    r = e.record
                    await self._apply(
                        keys=self._keys(gen, r.tenant, r.agent, r.id),
                        args=[
                            r.version,
                            r.model_dump_json(),
                            r.id,
                            sort_score(r),
                            int(listed(r)),
                            int(r.pinned and r.status is Status.ACTIVE),
                            field,
                            nxt,
                        ],
                        client=pipe,
                    )
                elif isinstance(e, AgentConfigured):
                    await pipe.set(f"{self._ns(gen)}:config:{e.tenant}/{e.agent}", e.config.model_dump_json())
                    if field:
                        await self._checkpoint(keys=[f"{self._ns(gen)}:ckpt"], args=[field, nxt], client=pipe)
                elif field:
                    await self._checkpoint(keys=[f"{self._ns(gen)}:ckpt"], args=[field, nxt], client=pipe)
            await pipe.execute()

    async def checkpoints(self, gen: int | None = None) -> dict[str, int]:
        gen = gen if gen is not None else await self.generation()
        raw = await self.r.hgetall(f"{self._ns(gen)}:ckpt")
        return {k: int(v) for k, v in raw.items()}

    # ------------------------------------------------------------------ read side

    async def get(self, tenant, agent, rid, version=None) -> MemoryRecord | None:
        key = self._keys(await self.generation(), tenant, agent, rid)[0]
        if version is None:
            version = await self.r.hget(key, "cur")
            if version is None:
                return None
        raw = await self.r.hget(key, f"v:{version}")
        return MemoryRecord.model_validate_json(raw) if raw else None

    async def get_many(self, tenant, agent, rids: list[str]) -> list[MemoryRecord]:
        out = []
        for rid in rids:
            r = await self.get(tenant, agent, rid)
            if r:
                out.append(r)
        return out

    async def history(self, tenant, agent, rid) -> list[MemoryRecord]:
        key = self._keys(await self.generation(), tenant, agent, rid)[0]
        raw = await self.r.hgetall(key)
        versions = sorted((int(k[2:]) for k in raw if k.startswith("v:")), reverse=True)
        return [MemoryRecord.model_validate_json(raw[f"v:{v}"]) for v in versions]

    async def page(self, tenant, agent, limit, after=None, ascending=False) -> Page:
        gen = await self.generation()
        key = self._keys(gen, tenant, agent, "-")[1]
        cur = decode_cursor(after) if after else None
        picked: list[tuple[float, str]] = []
        offset, chunk = 0, limit + 16
        while len(picked) <= limit:
            if ascending:
                lo = cur[0] if cur else "-inf"
                rows = await self.r.zrangebyscore(key, lo, "+inf", start=offset, num=chunk, withscores=True)
            else:
                hi = cur[0] if cur else "+inf"
                rows = await self.r.zrevrangebyscore(key, hi, "-inf", start=offset, num=chunk, withscores=True)
            if not rows:
                break
            for rid, score in rows:
                if cur and ((score, rid) <= cur if ascending else (score, rid) >= cur):
                    continue
                picked.append((score, rid))
            offset += len(rows)
        picked = picked[: limit + 1]
        records = await self.get_many(tenant, agent, [rid for _, rid in picked[:limit]])
        nxt = encode_cursor(*picked[limit - 1]) if len(picked) > limit else None
        return Page(records, nxt)

    async def pinned(self, tenant, agent) -> list[MemoryRecord]:
        key = self._keys(await self.generation(), tenant, agent, "-")[2]
        rids = await self.r.zrange(key, 0, -1)
        return [r for r in await self.get_many(tenant, agent, rids) if r.pinned and r.status is Status.ACTIVE]

    async def config(self, tenant: str, agent: str) -> AgentConfig | None:
        raw = await self.r.get(f"{self._ns(await self.generation())}:config:{tenant}/{agent}")
        return AgentConfig.model_validate_json(raw) if raw else None

    async def aclose(self) -> None:
        await self.r.aclose()
