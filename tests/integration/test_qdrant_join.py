"""The Qdrant projection joins events with vectors in bounded memory and strands nothing,
even when it lags the log far behind (regression: vectors ran ahead, fell out of the
cache, and their records waited forever)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
from aiokafka import AIOKafkaProducer

from events import RecordAdded, encode
from events.codec import PLAIN
from events.record import MemoryRecord
from events.topics import EVENTS, REDELIVERED, VECTORS
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from projections.qdrant.index import EdgeIndex, SearchFilter
from tests.conftest import eventually
from workers.followers.qdrant_projection import QdrantProjection
from workers.runtime.kafka_io import ensure_topics

N = 3000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def stopped(projection: QdrantProjection, task: asyncio.Task | None) -> None:
    projection.stopping.set()
    if task is not None:
        await task
    projection.index.close()


async def test_a_lagging_projection_strands_no_record(settings, tmp_path):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}join{uuid.uuid4().hex[:4]}."})
    await ensure_topics(s)
    rng = np.random.default_rng(3)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, linger_ms=20)
    await producer.start()
    try:
        for i in range(N):  # as the pipeline writes them: each event, then its vector
            r = MemoryRecord(id=f"r{i}", version=1, created=T0 + timedelta(seconds=i), modified=T0, tenant="t",
                             agent="a", scope="AGENT", kind="fact", summary=f"fact {i}")
            e = RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant="t", agent="a", occurred_at=T0, record=r)
            v = VectorComputed.of(MODEL_ID, content_hash(r.text), rng.standard_normal(384).astype(np.float32))
            await producer.send(s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e))
            await producer.send(s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v))
        await producer.flush()
    finally:
        await producer.stop()
    index = EdgeIndex(tmp_path / "shard")
    # A tiny cache and a checkpoint (so not a cold start): the projection follows both
    # topics live, thousands of messages behind.
    projection = QdrantProjection(s, index, vector_cache=50, codec=PLAIN)
    projection.ckpt = {f"{s.topic(VECTORS.name)}:0": 0}
    task = asyncio.create_task(projection.run())
    try:
        await eventually(lambda: index.count() == N, timeout=120, interval=0.5)
        assert projection.parked_count() == 0
        assert len(projection.vectors) <= 50
    finally:
        await stopped(projection, task)


async def test_a_bad_vector_is_skipped_and_its_record_waits_for_a_good_one(settings, tmp_path):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}badvec{uuid.uuid4().hex[:4]}."})
    await ensure_topics(s)
    r = MemoryRecord(id="r-bad", version=1, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                     kind="fact", summary="a fact whose first vector is broken")
    e = RecordAdded(event_id="e-bad", command_id="c-bad", tenant="t", agent="a", occurred_at=T0, record=r)
    good = VectorComputed.of(MODEL_ID, content_hash(r.text), np.ones(384, dtype=np.float32))
    key = VECTORS.key_bytes(good)
    index = EdgeIndex(tmp_path / "shard")
    projection = QdrantProjection(s, index, codec=PLAIN)
    projection.ckpt = {f"{s.topic(VECTORS.name)}:0": 0}  # follow live, not a cold start
    task = asyncio.create_task(projection.run())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e))
        # Vectors are decoded when a record joins one: these two are refused then, by name.
        await producer.send_and_wait(s.topic(VECTORS.name), b"not json", key=key)
        other = VectorComputed.of(MODEL_ID, "another-hash", np.ones(384, dtype=np.float32))
        await producer.send_and_wait(s.topic(VECTORS.name), encode(other), key=key)
        read_both = f"{s.topic(VECTORS.name)}:{VECTORS.partition_of(key)}"
        await eventually(lambda: projection.ckpt.get(read_both, 0) >= 2, timeout=30)
        assert index.count() == 0 and projection.parked_count() == 1
        await producer.send_and_wait(s.topic(VECTORS.name), encode(good), key=key)
        await eventually(lambda: index.count() == 1, timeout=30)
        assert projection.parked_count() == 0
    finally:
        await producer.stop()
        await stopped(projection, task)


async def test_after_a_restart_a_redelivered_old_event_changes_nothing(settings, tmp_path):
    """The ledger writes a redelivered command's events again, after newer versions of
    their records. A restarted projection no longer knows those versions; the header
    tells it the event was applied at its original offset."""
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}redeliv{uuid.uuid4().hex[:4]}."})
    await ensure_topics(s)
    v1 = MemoryRecord(id="r-re", version=1, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                      kind="fact", summary="the staging database is venus-db")
    v2 = v1.model_copy(update={"version": 2, "labels": {"team": "infra"}})  # same text: the vector is shared
    e1 = RecordAdded(event_id="e-re-1", command_id="c-re-1", tenant="t", agent="a", occurred_at=T0, record=v1)
    e2 = RecordAdded(event_id="e-re-2", command_id="c-re-2", tenant="t", agent="a", occurred_at=T0, record=v2)
    vec = VectorComputed.of(MODEL_ID, content_hash(v1.text), np.ones(384, dtype=np.float32))
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    events = s.topic(EVENTS.name)
    again, task = None, None
    try:
        for e in (e1, e2):
            await producer.send_and_wait(events, encode(e), key=EVENTS.key_bytes(e))
        await producer.send_and_wait(s.topic(VECTORS.name), encode(vec), key=VECTORS.key_bytes(vec))
        first = QdrantProjection(s, EdgeIndex(tmp_path / "shard"), codec=PLAIN)
        await first.run(until_caught_up=True)  # flushes and checkpoints at the end
        first.index.close()

        index = EdgeIndex(tmp_path / "shard")  # the restart: same shard and checkpoint, no memory
        again = QdrantProjection(s, index, codec=PLAIN)
        task = asyncio.create_task(again.run())
        await again.caught_up.wait()
        waiter = again.wait_for("c-re-1", "t", "a")
        # A redelivered first version, its vector also sent again (the cache would hold it).
        await producer.send_and_wait(events, encode(e1), key=EVENTS.key_bytes(e1), headers=[(REDELIVERED, b"1")])
        await producer.send_and_wait(s.topic(VECTORS.name), encode(vec), key=VECTORS.key_bytes(vec))
        assert [ev.event_id for ev in await asyncio.wait_for(waiter, 30)] == ["e-re-1"]
        vectors_read = f"{s.topic(VECTORS.name)}:{VECTORS.partition_of(VECTORS.key_bytes(vec))}"
        await eventually(lambda: again.ckpt.get(vectors_read, 0) >= 2, timeout=30)
        labelled = SearchFilter(tenant="t", agent="a", scopes=("AGENT",), session=None, preview=False,
                                labels=(("team", "infra"),))
        assert [h.record_id for h in index.search(labelled, None, "staging database", 5, "lexical")] == ["r-re"]
        assert again.parked_count() == 0
    finally:
        await producer.stop()
        if again:
            await stopped(again, task)


async def test_a_caller_that_gives_up_leaves_no_waiter_behind(settings, tmp_path):
    # A read-your-writes caller that times out cancels its future; the projection must drop
    # the waiter (and the command, when it was the last), not raise in the callback.
    projection = QdrantProjection(settings, EdgeIndex(tmp_path / "shard"), codec=PLAIN)
    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    first, second = projection.wait_for("c1", "t", "a"), projection.wait_for("c1", "t", "a")
    first.cancel()
    await asyncio.sleep(0)
    assert projection.waiters and len(next(iter(projection.waiters.values()))) == 1
    second.cancel()
    await asyncio.sleep(0)
    assert projection.waiters == {} and errors == []
