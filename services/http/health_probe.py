"""What `/health` says: every registered worker beating, its consumer group within the lag
bound, the API's own projections running. Anything else is "degraded" (HTTP 503).

`assess` is the pure rule; `HealthProbe` gathers its inputs (Redis heartbeats, Kafka group
offsets) at most once a second, however often `/health` is asked, on its own Redis
connection: sharing the API's pool, a burst of requests made the probe time out and
report the API degraded. A worker without a heartbeat for `worker_forget_s` is forgotten.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from events.topics import TOPICS
from projections.redis.connection import Connect
from settings import Settings
from workers.runtime.heartbeat import heartbeat_key, registry_key, seen_key
from workers.runtime.kafka_io import reader

PROBE_TIMEOUT_S = 3.0
CACHE_S = 1.0


@dataclass
class Observed:
    """What the probe saw: per registered worker its heartbeat (None: none alive) and its
    group's lag in messages (None: unreadable); problems met while looking."""

    beats: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    lags: dict[str, int | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def assess(seen: Observed, max_lag: int, tasks: dict[str, bool]) -> tuple[dict[str, Any], list[str]]:
    """(per-worker view, problems). `tasks`: the API's own background tasks, name -> running."""
    workers: dict[str, Any] = {}
    problems = list(seen.errors)
    for name in sorted(seen.beats):
        beat, lag = seen.beats[name], seen.lags.get(name)
        workers[name] = {"alive": beat is not None, "lag": lag}
        if beat is None:
            problems.append(f"worker {name}: no heartbeat; it is stopped or dead, start `memlane worker {name}` "
                            f"(or, if it is gone for good, `memlane worker {name} --deregister`)")
        elif lag is not None and lag > max_lag:
            problems.append(f"worker {name}: {lag} messages behind, over the bound of {max_lag}")
    for name, running in sorted(tasks.items()):
        if not running:
            problems.append(f"{name}: stopped in this API process; restart `memlane serve`")
    return workers, problems


def forgotten(dead: list[str], seen: dict[str, float], now: float, bound_s: float) -> tuple[list[str], list[str]]:
    """(names to forget, names to start timing) among the registered workers without a
    heartbeat. `seen`: name -> time of its last beat; a name with none (registered before
    beats were timed) starts being timed now."""
    drop = [n for n in dead if n in seen and now - seen[n] > bound_s]
    return drop, [n for n in dead if n not in seen]


class HealthProbe:
    def __init__(self, settings: Settings, redis: Connect, client: Any = None) -> None:
        self.settings = settings
        self._own_redis = client is None
        self.r = redis(decode_responses=False) if client is None else client
        self.admin: AIOKafkaAdminClient | None = None
        self.ends: Any = None
        self.cached: tuple[float, Observed] | None = None
        self.lock = asyncio.Lock()

    async def observe(self) -> Observed:
        async with self.lock:
            now = time.monotonic()
            if self.cached and now - self.cached[0] < CACHE_S:
                return self.cached[1]
            seen = Observed()
            try:
                await asyncio.wait_for(self._observe(seen), PROBE_TIMEOUT_S)
            except Exception as e:
                seen.errors.append(f"health probe: {type(e).__name__}; Redis or Kafka may be unreachable")
            self.cached = (time.monotonic(), seen)
            return seen

    async def _observe(self, seen: Observed) -> None:
        s = self.settings
        names = sorted(n if isinstance(n, str) else n.decode() for n in await self.r.smembers(registry_key(s)))
        raw = await self.r.mget([heartbeat_key(s, n) for n in names]) if names else []
        for name, value in zip(names, raw):
            seen.beats[name] = json.loads(value) if value else None
        dead = [n for n, b in seen.beats.items() if b is None]
        if dead:
            await self._forget(seen, dead)
        groups = {n: b for n, b in seen.beats.items() if b}
        if groups:
            lags = await self._lags({n: (b["group"], b["topics"]) for n, b in groups.items()})
            seen.lags.update(lags)

    async def _forget(self, seen: Observed, dead: list[str]) -> None:
        s = self.settings
        raw = await self.r.hgetall(seen_key(s))
        last = {(k if isinstance(k, str) else k.decode()): float(v) for k, v in raw.items()}
        drop, start = forgotten(dead, last, time.time(), s.worker_forget_s)
        async with self.r.pipeline(transaction=False) as p:
            for name in start:
                p.hsetnx(seen_key(s), name, time.time())
            if drop:
                p.srem(registry_key(s), *drop)
                p.hdel(seen_key(s), *drop)
            await p.execute()
        for name in drop:
            del seen.beats[name]

    async def _lags(self, groups: dict[str, tuple[str, list[str]]]) -> dict[str, int | None]:
        s = self.settings
        if self.admin is None:
            self.admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
            await self.admin.start()
            self.ends = reader(s)
            await self.ends.start()
        tps = {TopicPartition(s.topic(t), p) for _, topics in groups.values() for t in topics if t in TOPICS
               for p in range(TOPICS[t].partitions)}
        # read_committed: the last stable offset, past which a worker cannot read yet anyway.
        ends = await self.ends.end_offsets(list(tps))
        out: dict[str, int | None] = {}
        for name, (group, topics) in groups.items():
            committed = await self.admin.list_consumer_group_offsets(group)
            wanted = {s.topic(t) for t in topics}
            mine = [tp for tp in tps if tp.topic in wanted]
            done = {tp: max(0, c.offset) for tp, c in committed.items()}
            out[name] = sum(max(0, ends[tp] - done.get(tp, 0)) for tp in mine)
        return out

    async def close(self) -> None:
        if self._own_redis:
            await self.r.aclose()
        for c in (self.ends, self.admin):
            if c is not None:
                try:
                    await (c.stop() if c is self.ends else c.close())
                except Exception:
                    pass

