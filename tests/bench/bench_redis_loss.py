"""`make bench ONLY=redisloss`: how soon the record view is served again after Redis loses
everything (docs/operations/runbook.md: a lost Redis is folded back from the log).

`redis_loss_recovery_s` (`view: "records"`): `MEMLANE_BENCH_REDISLOSS_RECORDS` records (default
100,000, over 500 agents) decided by the ledger and folded by the Redis projection into a
redis-server of the bench's own. Then FLUSHALL, with every process running, and the figure runs
until the view holds every record again. Checked before it prints: every agent's listing holds
exactly its records, the same before and after. Encryption is off: the bench reads the view
without the deployment's keys.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from events.codec import encode
from events.commands import AddMemory
from events.record import Provenance, Source
from events.topics import COMMANDS
from projections.redis.record_view import RedisRecords
from tests.bench.common import bench_stack, figure, progress
from tests.private_redis import PrivateRedis
from tests.redis_at import redis_at
from workers.runtime.kafka_io import ensure_topics

RECORDS = int(os.environ.get("MEMLANE_BENCH_REDISLOSS_RECORDS", "100000"))
AGENTS = 500  # 200 each: an agent holds at most 200 live facts


async def _commands(bootstrap: str, topic: str) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await p.start()
    try:
        now = datetime.now(UTC)
        futs = []
        for i in range(RECORDS):
            cmd = AddMemory(command_id=str(uuid.uuid4()), tenant="tloss", agent=f"a{i % AGENTS}", issued_at=now,
                            summary=f"Fact number {i} about item {i * 7919 % 100003}", session="s1",
                            provenance=Provenance(source=Source.OPERATOR, modified_by="operator:bench"))
            futs.append(await p.send(topic, encode(cmd), key=COMMANDS.key_bytes(cmd)))
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def _listings(view: RedisRecords) -> dict[str, list[str]]:
    out = {}
    for a in range(AGENTS):
        page = await view.page("tloss", f"a{a}", RECORDS // AGENTS + 10)
        out[f"a{a}"] = sorted(r.id for r in page.records)
    return out


async def _until_whole(view: RedisRecords, timeout: float) -> dict[str, list[str]]:
    """Until every record is listed; fails when the view stops growing for `timeout` seconds."""
    last, since = -1, time.monotonic()
    while True:
        got = await _listings(view)
        n = sum(map(len, got.values()))
        if n >= RECORDS:
            return got
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > timeout:
            raise AssertionError(f"the view holds {n} of {RECORDS} records and stopped growing")
        await asyncio.sleep(0.2)


async def run() -> None:
    redis = PrivateRedis(Path(tempfile.mkdtemp(prefix="memlane-bench-redis-")))
    redis.start()
    try:
        with bench_stack("redisloss", api=False, workers=("ledger", "redis-projection"),
                         env={"REDIS_URL": redis.url, "MEMLANE_ENCRYPTION": "0"}) as (stack, settings):
            await ensure_topics(settings)
            t0 = time.monotonic()
            await _commands(settings.kafka_bootstrap, settings.topic(COMMANDS.name))
            view = RedisRecords(redis_at(redis.url)(pooled=True), namespace=settings.topic_prefix)
            try:
                before = await _until_whole(view, timeout=60)
                progress(f"{RECORDS} records decided and folded in {time.monotonic() - t0:.1f} s")
                r = aioredis.from_url(redis.url)
                try:
                    await r.flushall()
                finally:
                    await r.aclose()
                t0 = time.monotonic()
                after = await _until_whole(view, timeout=60)
                took = time.monotonic() - t0
            finally:
                await view.aclose()
            if after != before:
                raise AssertionError("the view folded back from the log differs from the one Redis lost")
            figure("redis_loss_recovery_s", took, "s", RECORDS, view="records", agents=AGENTS)
    finally:
        redis.stop()
