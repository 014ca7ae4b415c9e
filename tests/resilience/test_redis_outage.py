"""Stop Redis under a running projection, start it again: the worker retries with
backoff, commits no offset past the failure, and catches up with nothing lost or doubled."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from events import RecordAdded, RecordDeleted, encode
from events.record import MemoryRecord, Status
from events.topics import EVENTS
from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.runtime.kafka_io import ensure_topics

T0 = datetime(2026, 2, 1, tzinfo=UTC)


def events_for(tenant: str, n: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + n):
        r = MemoryRecord(id=f"r{i}", version=1, created=T0 + timedelta(seconds=i), modified=T0, tenant=tenant,
                         agent="a", scope="AGENT", kind="fact", summary=f"fact {i}")
        out.append(RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant=tenant, agent="a", occurred_at=T0,
                               record=r))
        if i % 5 == 0:
            gone = r.model_copy(update={"version": 2, "status": Status.DELETED})
            out.append(RecordDeleted(event_id=f"d{i}", command_id=f"x{i}", tenant=tenant, agent="a", occurred_at=T0,
                                     record=gone))
    return out


# On the bare deployment (tests/stacks.py), whose Redis is its own: the test stops it and starts it again.
async def test_projection_survives_a_redis_outage(bare_stack):
    stack, settings, redis = bare_stack.stack, bare_stack.settings, bare_stack.redis
    prefix = settings.topic_prefix
    topic = prefix + EVENTS.name
    tenant = f"out{uuid.uuid4().hex[:6]}"
    await ensure_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    view = RedisRecords(redis_at(redis.url)(pooled=True), namespace=prefix)
    group = f"{settings.group_prefix}.{prefix}redis-projection"
    before = await _ends(settings.kafka_bootstrap, topic)  # the earlier modules' events
    try:
        stack.start("redis-projection")
        first, second = events_for(tenant, 500), events_for(tenant, 500, start=500)
        for e in first:
            await producer.send(topic, encode(e), key=EVENTS.key_bytes(e))
        await producer.flush()

        async def some_applied():
            return await view.get(tenant, "a", "r499") is not None

        await eventually(some_applied, timeout=60)
        redis.stop()
        for e in second:
            await producer.send(topic, encode(e), key=EVENTS.key_bytes(e))
        await producer.flush()

        log = stack.log_dir / "redis-projection.log"
        await eventually(lambda: "dependency_unavailable_retrying" in log.read_text(), timeout=30)
        # While Redis is down, no offset moves past what Redis holds.
        committed = await _committed(settings.kafka_bootstrap, group, topic)
        assert sum(committed.values()) <= before + len(first) + 100  # deletes in `first` add 100 events
        redis.start()

        fold = MemoryFold()
        await fold.apply(first + second)

        async def caught_up():
            for (t, a, rid), v in fold.current.items():
                r = await view.get(t, a, rid)
                if r is None or r.version != v:
                    return False
            return True

        await eventually(caught_up, timeout=60, interval=0.5)
        for i in (0, 5, 499, 500, 505, 999):
            assert await view.history(tenant, "a", f"r{i}") == await fold.history(tenant, "a", f"r{i}")
        page = await view.page(tenant, "a", 2000)
        assert [r.id for r in page.records] == [r.id for r in (await fold.page(tenant, "a", 2000)).records]
    finally:
        stack.stop()
        await producer.stop()
        await view.aclose()
        if not redis.ping():  # the deployment's later modules need it
            redis.start()


async def _ends(bootstrap: str, topic: str) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await c.start()
    try:
        return sum((await c.end_offsets([TopicPartition(topic, p) for p in range(EVENTS.partitions)])).values())
    finally:
        await c.stop()


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        out = {}
        for p in range(EVENTS.partitions):
            off = await c.committed(TopicPartition(topic, p))
            out[p] = off or 0
        return out
    finally:
        await c.stop()
