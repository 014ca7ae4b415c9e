"""A crash of the Qdrant projection loses no record (regression: its checkpoint passed
events still parked for their vector, and vectors read before their event, so after
kill -9 those records stayed readable in Redis and never became points).

Each test runs the projection over a real broker and a real Edge shard until it has saved
a checkpoint, stops it without another save (as a crash would), then restarts it from
that checkpoint."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import numpy as np
from aiokafka import AIOKafkaProducer

from events import RecordAdded, encode
from events.codec import PLAIN
from events.record import MemoryRecord
from events.topics import EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from projections.qdrant.index import EdgeIndex
from tests.conftest import eventually
from workers.followers import qdrant_projection
from workers.followers.qdrant_projection import QdrantProjection
from workers.runtime.kafka_io import ensure_topics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record_event(i: int) -> RecordAdded:
    r = MemoryRecord(id=f"r{i}", version=1, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                     kind="fact", summary=f"checkpoint fact number {i}")
    return RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant="t", agent="a", occurred_at=T0, record=r)


def vector_of(e: RecordAdded) -> VectorComputed:
    rng = np.random.default_rng(int(e.record.id[1:]))
    return VectorComputed.of(MODEL_ID, content_hash(e.record.text), rng.standard_normal(384).astype(np.float32))


class Pipeline:
    """The topics of one test and what writes to them as the ledger and the embedding
    worker would: an agent's events to its partition, their vectors beside them."""

    def __init__(self, settings) -> None:
        self.s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}ckpt{uuid.uuid4().hex[:4]}."})
        self.partition = EVENTS.partition_of(EVENTS.key_bytes(record_event(0)))
        self.events_key = f"{self.s.topic(EVENTS.name)}:{self.partition}"
        self.vectors_key = f"{self.s.topic(VECTORS.name)}:{vector_partition(self.partition)}"

    async def __aenter__(self) -> Pipeline:
        await ensure_topics(self.s)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.s.kafka_bootstrap)
        await self.producer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.producer.stop()

    async def events(self, *events: RecordAdded) -> None:
        for e in events:
            await self.producer.send_and_wait(self.s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e))

    async def vectors(self, *events: RecordAdded) -> None:
        for e in events:
            v = vector_of(e)
            await self.producer.send_and_wait(self.s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v),
                                              partition=vector_partition(self.partition))


class Saves:
    """Every checkpoint saved, each with the positions its projection had read and written
    when it saved (a save comes only after every batch read is written)."""

    def __init__(self) -> None:
        self.notes: list[tuple[QdrantProjection, dict[str, int]]] = []
        self.live: list[QdrantProjection] = []


def watch_saves(monkeypatch) -> Saves:
    """Saves noted, and made every few milliseconds."""
    saves = Saves()
    write = qdrant_projection.write_checkpoint

    def noted(path, ckpt):
        write(path, ckpt)
        for p in saves.live:
            if p.ckpt_path == path:
                saves.notes.append((p, dict(p.ckpt)))

    monkeypatch.setattr(qdrant_projection, "write_checkpoint", noted)
    monkeypatch.setattr(qdrant_projection, "LIVE_FLUSH_S", 0.01)
    return saves


def start(pipe: Pipeline, path, saves: Saves, live: bool, **run) -> tuple[QdrantProjection, asyncio.Task]:
    projection = QdrantProjection(pipe.s, EdgeIndex(path), codec=PLAIN)
    if live:  # following the log, not a cold start (which reads every vector first)
        projection.ckpt.setdefault(pipe.vectors_key, 0)
    saves.live.append(projection)
    return projection, asyncio.create_task(projection.run(**run))


async def crash(projection: QdrantProjection, task: asyncio.Task) -> None:
    """Stop where it is: no final save (closing the shard must flush, to open it again)."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    projection.index.close()


async def saved(saves: Saves, projection: QdrantProjection, **at_least: int) -> None:
    def done():
        return any(p is projection and all(ck.get(k, 0) >= v for k, v in at_least.items()) for p, ck in saves.notes)

    await eventually(done, timeout=30, interval=0.02)


async def test_events_parked_for_their_vector_at_a_crash_become_points_after_it(settings, tmp_path, monkeypatch):
    saves = watch_saves(monkeypatch)
    e = [record_event(i) for i in range(5)]
    async with Pipeline(settings) as pipe:
        # r0 and r3 join their vectors; r1, r2 and r4 wait for theirs when the projection stops.
        await pipe.events(*e)
        await pipe.vectors(e[0], e[3])
        first, task = start(pipe, tmp_path / "shard", saves, live=True)
        await eventually(lambda: first.index.count() == 2 and first.parked_count() == 3, timeout=30)
        await saved(saves, first, **{pipe.events_key: 5, pipe.vectors_key: 2})
        await crash(first, task)

        await pipe.vectors(e[1], e[2], e[4])
        again, task = start(pipe, tmp_path / "shard", saves, live=False)
        try:
            await eventually(lambda: again.index.count() == 5, timeout=20)
            assert again.index.record_ids("t", "a") == {f"r{i}" for i in range(5)}
            # r3 was a point already, and its vector is behind the vectors' checkpoint: it
            # must not be read again and wait for that vector for ever.
            await eventually(lambda: again.caught_up.is_set() and again.parked_count() == 0, timeout=20)
        finally:
            await crash(again, task)


async def test_a_vector_read_before_its_event_is_read_again_after_a_crash(settings, tmp_path, monkeypatch):
    saves = watch_saves(monkeypatch)
    e = [record_event(i) for i in range(3)]
    async with Pipeline(settings) as pipe:
        await pipe.events(*e)
        await pipe.vectors(*e)
        # The events' partition lags, its vectors are read: the projection stops its
        # events at their start, and (seeing them fetched) must not take them for read.
        monkeypatch.setattr(QdrantProjection, "_release_vectors", lambda self: None, raising=False)
        first, task = start(pipe, tmp_path / "shard", saves, live=True, stop={pipe.partition: 0})
        await saved(saves, first, **{pipe.vectors_key: 3})
        assert first.index.count() == 0
        await crash(first, task)
        monkeypatch.undo()

        again, task = start(pipe, tmp_path / "shard", saves, live=False)
        try:
            await eventually(lambda: again.index.count() == 3, timeout=20)
            assert again.index.record_ids("t", "a") == {"r0", "r1", "r2"} and again.parked_count() == 0
        finally:
            await crash(again, task)


async def test_a_crash_during_the_first_pass_over_the_vectors_strands_nothing(settings, tmp_path, monkeypatch):
    """A cold start reads every vector before any event; a checkpoint of that pass alone
    would skip the vectors on the next start."""
    saves = watch_saves(monkeypatch)
    e = [record_event(i) for i in range(3)]
    async with Pipeline(settings) as pipe:
        await pipe.events(*e)
        await pipe.vectors(*e)
        first = QdrantProjection(pipe.s, EdgeIndex(tmp_path / "shard"), codec=PLAIN)
        saves.live.append(first)
        c = qdrant_projection.TopicReader(pipe.s)
        await c.start()
        try:
            from aiokafka import TopicPartition

            vtps = [TopicPartition(pipe.s.topic(VECTORS.name), p) for p in range(VECTORS.partitions)]
            first.vector_cache = None
            await first._follow(c, vtps, until_caught_up=True, progress=None)  # the vectors-first pass alone
        finally:
            await c.stop()
        first.index.close()

        again, task = start(pipe, tmp_path / "shard", saves, live=False)
        try:
            await eventually(lambda: again.index.count() == 3, timeout=20)
        finally:
            await crash(again, task)
