"""Redis adapter of the record view.

Keys live under a generation namespace `ml:g<N>:`, and `ml:generation` points at the
one readers use, so a rebuild can fill a new generation and switch over atomically.
Each event is applied by one Lua script that checks the version and writes the view and
the projection's checkpoint together: the tracking record lives with the view.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from events.config import AgentConfig
from events.memory import RECORD_EVENTS, AgentConfigured
from events.record import LIVE, MemoryRecord, Status
from projections.records import Page, decode_cursor, encode_cursor, listed, sort_score

# One call applies a whole batch. ARGV[1]: namespace; ARGV[2]: JSON list of
# [agent key, record id, version, snapshot json, sort score, listed 0/1, pinned 0/1,
# expiry ms of a live record or -1];
# ARGV[3]: JSON object {checkpoint field: next offset}. Keys are derived in the script,
# so this needs a single Redis node (not Cluster).
APPLY = """
local ns = ARGV[1]
local applied = 0
for _, it in ipairs(cjson.decode(ARGV[2])) do
  local rk = ns .. ':rec:' .. it[1] .. ':' .. it[2]
  local ver = it[3]
  redis.call('HSETNX', rk, 'v:' .. ver, it[4])
  local cur = tonumber(redis.call('HGET', rk, 'cur') or '0')
  if ver > cur then
    redis.call('HSET', rk, 'cur', ver)
    local lk, pk = ns .. ':list:' .. it[1], ns .. ':pinned:' .. it[1]
    if it[6] == 1 then redis.call('ZADD', lk, it[5], it[2]) else redis.call('ZREM', lk, it[2]) end
    if it[7] == 1 then redis.call('ZADD', pk, it[5], it[2]) else redis.call('ZREM', pk, it[2]) end
    local xm = it[1] .. '|' .. it[2]
    if it[8] >= 0 then redis.call('ZADD', ns .. ':expiry', it[8], xm) else redis.call('ZREM', ns .. ':expiry', xm) end
    applied = applied + 1
  end
end
local ck = ns .. ':ckpt'
for field, nxt in pairs(cjson.decode(ARGV[3])) do
  local cur = tonumber(redis.call('HGET', ck, field) or '-1')
  if nxt > cur then redis.call('HSET', ck, field, nxt) end
end
return applied
"""


def connect(url: str) -> aioredis.Redis:
    """A client that reconnects and retries a few times when Redis restarts under it."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError

    return aioredis.from_url(
        url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 5),
        retry_on_error=[ConnectionError, TimeoutError],
    )


class RedisRecords:
    def __init__(self, client: aioredis.Redis, generation: int | None = None, namespace: str = "") -> None:
        self.r = client
        self.fixed_generation = generation
        # Deployments sharing one Redis (tests, demos) keep apart by namespace.
        self.root = f"ml:{namespace}"
        self._apply = client.register_script(APPLY)

    @classmethod
    def from_url(cls, url: str, generation: int | None = None, namespace: str = "") -> RedisRecords:
        return cls(connect(url), generation, namespace)

    async def generation(self) -> int:
        if self.fixed_generation is not None:
            return self.fixed_generation
        g = await self.r.get(f"{self.root}generation")
        return int(g) if g else 1

    async def switch_generation(self, gen: int) -> None:
        await self.r.set(f"{self.root}generation", gen)

    async def generations(self) -> list[int]:
        """Generations that hold a checkpoint, ascending."""
        gens = set()
        async for key in self.r.scan_iter(f"{self.root}g*:ckpt", count=10_000):
            head = key[len(self.root) + 1 :].split(":")[0]
            if head.isdigit():
                gens.add(int(head))
        return sorted(gens)

    async def drop_generation(self, gen: int) -> int:
        """Delete a generation's keys, in batches so Redis keeps serving meanwhile."""
        dropped, batch = 0, []
        async for key in self.r.scan_iter(f"{self._ns(gen)}:*", count=10_000):
            batch.append(key)
            if len(batch) >= 5_000:
                dropped += await self.r.unlink(*batch)
                batch = []
        if batch:
            dropped += await self.r.unlink(*batch)
        return dropped

    def _ns(self, gen: int) -> str:
        return f"{self.root}g{gen}"

    def _keys(self, gen: int, tenant: str, agent: str, rid: str) -> list[str]:
        # Must match the key names built inside APPLY.
        ns, ak = self._ns(gen), f"{tenant}/{agent}"
        return [f"{ns}:rec:{ak}:{rid}", f"{ns}:list:{ak}", f"{ns}:pinned:{ak}", f"{ns}:ckpt"]

    # ------------------------------------------------------------------ write side

    async def apply(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """Apply events; `positions[i]` is the (topic:partition, next offset) checkpoint of event i.

        The view and its checkpoints change in one script call: either both or neither.
        """
        gen = await self.generation()
        ns = self._ns(gen)
        items, ckpt, configs = [], {}, []
        for i, e in enumerate(events):
            if positions:
                field, nxt = positions[i]
                ckpt[field] = max(nxt, ckpt.get(field, 0))
            if isinstance(e, RECORD_EVENTS):
                r = e.record
                items.append(
                    [
                        f"{r.tenant}/{r.agent}",
                        r.id,
                        r.version,
                        r.model_dump_json(),
                        sort_score(r),
                        int(listed(r)),
                        int(r.pinned and r.status is Status.ACTIVE),
                        int(r.expires_at.timestamp() * 1000) if r.expires_at and r.status in LIVE else -1,
                    ]
                )
            elif isinstance(e, AgentConfigured):
                configs.append((f"{ns}:config:{e.tenant}/{e.agent}", e.config.model_dump_json()))
        if configs:
            await self.r.mset(dict(configs))
        await self._apply(args=[ns, json.dumps(items), json.dumps(ckpt) if ckpt else "{}"])

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
        """Current versions of `rids`, in order, skipping unknown ids: two round trips in all."""
        if not rids:
            return []
        gen = await self.generation()
        keys = [self._keys(gen, tenant, agent, rid)[0] for rid in rids]
        async with self.r.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hget(k, "cur")
            currents = await pipe.execute()
        found = [(k, cur) for k, cur in zip(keys, currents) if cur is not None]
        async with self.r.pipeline(transaction=False) as pipe:
            for k, cur in found:
                pipe.hget(k, f"v:{cur}")
            raws = await pipe.execute()
        return [MemoryRecord.model_validate_json(raw) for raw in raws if raw]

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

    async def expired(self, at_ms: int) -> dict[tuple[str, str], list[str]]:
        """Live records whose expiry is at or before `at_ms`, by (tenant, agent): what a
        sweep asks the ledger to tombstone."""
        out: dict[tuple[str, str], list[str]] = {}
        ns = self._ns(await self.generation())
        for member in await self.r.zrangebyscore(f"{ns}:expiry", "-inf", at_ms):
            ak, _, rid = member.partition("|")
            tenant, _, agent = ak.partition("/")
            out.setdefault((tenant, agent), []).append(rid)
        return out

    async def aclose(self) -> None:
        await self.r.aclose()
