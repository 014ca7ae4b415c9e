"""What `/health` says: every registered worker beating, its consumer group within the lag
bound, the API's own projections running. Anything else is "degraded" (HTTP 503).

`assess` is the pure rule; `HealthProbe` gathers its inputs (Redis heartbeats, Kafka group
offsets) at most once a second, however often `/health` is asked.
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
from services.settings import Settings
from workers.heartbeat import heartbeat_key, registry_key
from workers.kafka_io import reader

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
            problems.append(f"worker {name}: no heartbeat; it is stopped or dead, start `memlane worker {name}`")
        elif lag is not None and lag > max_lag:
            problems.append(f"worker {name}: {lag} messages behind, over the bound of {max_lag}")
    for name, running in sorted(tasks.items()):
        if not running:
            problems.append(f"{name}: stopped in this API process; restart `memlane serve`")
    return workers, problems


class HealthProbe:
    def __init__(self, settings: Settings, redis: Any) -> None:
        self.settings = settings
        self.r = redis
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
        groups = {n: b for n, b in seen.beats.items() if b}
        if groups:
            lags = await self._lags({n: (b["group"], b["topics"]) for n, b in groups.items()})
            seen.lags.update(lags)

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
        for c in (self.ends, self.admin):
            if c is not None:
                try:
                    await (c.stop() if c is self.ends else c.close())
                except Exception:
                    pass

