"""The history projection joins turns with their parts' vectors safely across a restart (real
Kafka, Edge).

A turn whose vectors have not come is parked, and the saved checkpoint never passes it; a
turn after it that was indexed before the restart is found in the shard when read again (its
vectors went by and are not sent again), so the restarted projection waits for the parked
turn's vectors alone, and indexes it once the embedding worker sends them.
"""

from __future__ import annotations

import asyncio
import uuid

from events import Message
from events.codec import PLAIN, encode
from events.rules.history import kept_events, parts_of
from events.topics import HISTORY_VECTORS, TURNS
from events.vectors import VectorComputed
from projections.embedders.onnx import OnnxMiniLM
from projections.qdrant.history_index import HistoryIndex
from projections.qdrant.index import read_checkpoint
from services.client import TurnPublisher
from settings import Settings
from tests.conftest import eventually
from tests.e2e.test_history import turn
from tests.integration.test_history_replay import _embed_history
from workers.followers.history_qdrant import READ, HistoryQdrantProjection
from workers.runtime.kafka_io import ensure_topics, producer


async def test_a_parked_turn_holds_the_checkpoint_and_a_restart_waits_for_it_alone(settings: Settings, tmp_path):
    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}join{uuid.uuid4().hex[:4]}."})
    await ensure_topics(settings)
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    # One session, so both turns share a partition: the parked one first, the indexed one after.
    parked = turn(tenant, agent, 1, [Message(id="p1", role="user", content="the otter fed on mussels at dawn")])
    indexed = turn(tenant, agent, 2, [Message(id="i1", role="user", content="the heron waited by the weir"),
                                      Message(id="i2", role="assistant", content="herons wait for hours")])
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(parked)
        await pub.publish(indexed)
    part = TURNS.partition_of(TURNS.key_bytes(parked))
    ids = {t.turn: [pid for e in kept_events(t) for pid, *_ in parts_of(e)] for t in (parked, indexed)}

    # The later turn's vectors only, as the embedding worker would write them.
    embedder = OnnxMiniLM()
    texts = {pid: text for e in kept_events(indexed) for pid, _, _, text in parts_of(e)}
    prod = producer(settings)
    await prod.start()
    try:
        for pid, vec in zip(texts, embedder.embed(list(texts.values())), strict=True):
            msg = VectorComputed.of(embedder.model_id, pid, vec)
            await prod.send_and_wait(settings.topic(HISTORY_VECTORS.name), encode(msg), key=HISTORY_VECTORS.key_bytes(msg),
                                     partition=part)
    finally:
        await prod.stop()

    index = HistoryIndex(tmp_path / "history-g1")
    try:
        first = HistoryQdrantProjection(settings, index, codec=PLAIN)
        await first.run(until_caught_up=True)
        assert index.held(ids[1] + ids[2]) == set(ids[2])
        assert first.status()["parked"] == 1 and first.turns == 1
        saved = read_checkpoint(first.ckpt_path)
        turns_part = f"{settings.topic(TURNS.name)}:{part}"
        assert saved[turns_part] == 0  # held back to the parked turn, not past it
        assert saved[READ] == {turns_part: 2}  # the turn after it was indexed

        second = HistoryQdrantProjection(settings, index, codec=PLAIN)
        task = asyncio.create_task(second.run())
        try:
            await eventually(second.caught_up.is_set, timeout=30)
            # The indexed turn was found in the shard, not parked for vectors that went by.
            assert second.status()["parked"] == 1 and second.turns == 1
            sent = await _embed_history(settings, embedder)
            assert {k.rpartition("/")[2] for k in sent} == set(ids[1] + ids[2])
            await eventually(lambda: second.status()["parked"] == 0 and second.turns == 2, timeout=30)
            assert index.held(ids[1] + ids[2]) == set(ids[1] + ids[2])
        finally:
            second.stopping.set()
            await task
        assert read_checkpoint(second.ckpt_path)[READ] == {}  # nothing parked: it resumes where it read to
    finally:
        index.close()
