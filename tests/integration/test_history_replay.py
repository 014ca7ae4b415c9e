"""Replaying `memlane.turns` rebuilds both sides of session history (real Kafka, Redis, Edge).

The Redis side (`memlane worker history`) and the Qdrant side (the API's projection, which
joins the turns with the embedding worker's part vectors) are each folded from offset 0 into
fresh state, twice, and must equal the pure fold of the same turns: nothing lost, nothing
doubled, the rolled-back attempt absent, no vector beyond the kept parts.
"""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaProducer, TopicPartition

from events.codec import PLAIN
from events.rules.history import kept_events
from events.topics import HISTORY_VECTORS, TURNS
from projections.embedders.onnx import OnnxMiniLM
from projections.qdrant.history_index import HistoryIndex, event_parts
from projections.redis.history_view import RedisHistory
from services.client import TurnPublisher
from settings import Settings
from tests.conftest import eventually
from tests.dead_letters import dead_letters
from tests.e2e.test_history import conversation
from tests.redis_at import redis_at
from workers.followers.history_qdrant import HistoryQdrantProjection
from workers.processors.history_embedding import HistoryEmbeddingProcessor
from workers.processors.history_projection import HistoryProcessor
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.runner import Runner


async def _fold_redis(settings: Settings, generation: int, topics=(TURNS,)) -> None:
    """`memlane worker history` into `generation` until it has read `topics` to their ends
    (a fresh generation: from offset 0, a replay)."""
    proc = HistoryProcessor(settings, redis_at(settings.redis_url), generation=generation, codec=PLAIN)
    runner = Runner(proc, settings, group=f"{settings.group_prefix}.replay.{uuid.uuid4().hex[:6]}")
    task = asyncio.create_task(runner.run())
    store = RedisHistory(redis_at(settings.redis_url)(), settings.topic_prefix, generation)
    tps = [TopicPartition(settings.topic(t.name), p) for t in topics for p in range(t.partitions)]
    end = await runner_end_offsets(settings, tps)
    try:
        async def caught_up():
            ck = await store.checkpoints()
            return all(ck.get(f"{tp.topic}:{tp.partition}", 0) >= end[tp] for tp in tps if end[tp])

        await eventually(caught_up, timeout=60)
    finally:
        runner.stopping.set()
        await task
        await store.aclose()


async def _embed_history(settings: Settings, embedder) -> list:
    """Runs the history embedding worker until every turn is read; returns the history vectors' keys."""
    proc = HistoryEmbeddingProcessor(settings, embedder, codec=PLAIN)
    runner = Runner(proc, settings, group=f"{settings.group_prefix}.embed.{uuid.uuid4().hex[:6]}")
    task = asyncio.create_task(runner.run())
    tps = [TopicPartition(settings.topic(TURNS.name), p) for p in range(TURNS.partitions)]
    end = await runner_end_offsets(settings, tps)
    vtps = [TopicPartition(settings.topic(HISTORY_VECTORS.name), p) for p in range(HISTORY_VECTORS.partitions)]
    try:
        async def read_and_sent():
            # Committed offsets move once a batch's vectors are written.
            if not runner.assignments:
                return False
            committed = {tp: await runner.consumer.committed(tp) for tp in tps}
            return all((committed.get(tp) or 0) >= end[tp] for tp in tps)

        await eventually(read_and_sent, timeout=90)
    finally:
        runner.stopping.set()
        await task
    from workers.runtime.topic_reader import TopicReader

    async with TopicReader(settings) as c:
        return [m.key.decode() for m in await c.read_all(vtps)]


async def runner_end_offsets(settings: Settings, tps):
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await c.start()
    try:
        return await c.end_offsets(tps)
    finally:
        await c.stop()


async def test_replaying_the_turns_topic_rebuilds_both_sides(settings, tmp_path):
    # A topic of this test's own: replaying the session's shared topic would fold every
    # other test's turns too.
    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}replay{uuid.uuid4().hex[:4]}."})
    await ensure_topics(settings)
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    turns = conversation(tenant, agent)
    # A message that breaks the contract, ahead of the session's turns on their partition: every
    # reader parks it in the turns DLQ and goes on.
    poison = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await poison.start()
    await poison.send_and_wait(settings.topic(TURNS.name), b"\x00not json", key=TURNS.key_bytes(turns[0]))
    await poison.stop()
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for ev in turns:
            await pub.publish(ev)
    expected = {e.id: e for t in turns if t.type == "TurnCommitted" for e in kept_events(t)}
    expected_points = {pid for e in expected.values() for pid, _ in event_parts(e)}

    # Redis: two replays into fresh generations agree with the pure fold.
    for gen in (901, 902):
        await _fold_redis(settings, gen)
        store = RedisHistory(redis_at(settings.redis_url)(), settings.topic_prefix, gen)
        got = await store.get_many(tenant, agent, "s1", list(expected) + ["never"])
        await store.r.delete(*[k async for k in store.r.scan_iter(f"{store.ns}:*", count=10_000)])
        await store.aclose()
        assert {e.id: e for e in got} == expected

    # The embedding worker sends one vector per kept part (none for the rolled-back attempt),
    # named by model and point id.
    embedder = OnnxMiniLM()
    sent = await _embed_history(settings, embedder)
    assert sorted(k.rpartition("/")[2] for k in sent) == sorted(expected_points)
    assert {k.rpartition("/")[0] for k in sent} == {embedder.model_id}

    # Qdrant: a fresh shard joins turns and vectors; folding it again from offset 0 changes nothing.
    index = HistoryIndex(tmp_path / "history-g1")
    try:
        for _ in range(2):
            proj = HistoryQdrantProjection(settings, index, codec=PLAIN)
            proj.ckpt = {}
            await proj.run(until_caught_up=True)
            assert proj.status()["parked"] == 0 and not proj.held
            assert proj.poison.parked == 1
            rows = index.shard.retrieve(sorted(expected_points), ["event_id", "session", "agent"], False)
            assert {str(r.id) for r in rows} == expected_points
            assert index.count() == len(expected_points)
            assert all(r.payload["agent"] == agent for r in rows)
    finally:
        index.close()
    parked = [dict(m.headers) for m in await dead_letters(settings, TURNS.dlq)]
    assert sum(h["consumer_group"] == proj.poison.group.encode() for h in parked) == 2  # once per fold
