"""Encryption at rest and erasure in the memory projections, with real Kafka, Redis and Edge
shards and data keys on a keys topic of their own.

- A vector belongs to its record's subject: keyed hash, sealed dense vector, embedded once
  per subject, tombstoned when the subject is erased, unreadable once its key is destroyed.
- An erasure of a member on every agent reaches every memory shard of the serving process.
- What was sealed under a destroyed key is skipped and counted by a fresh generation.
- The record view holds no plaintext, and leaves out what it can no longer open.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from events import BlockChanged, RecordAdded, SubjectErased, encode
from events.codec import Codec
from events.commands import WORKSPACE
from events.lean import as_lean, decode_lean_vector
from events.record import MemoryRecord
from events.sealing import KeyDestroyed, subject_of
from events.topics import EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders.onnx import OnnxMiniLM
from projections.embedders.port import MODEL_ID
from projections.qdrant.index import SearchFilter
from projections.redis.record_view import RedisRecords
from services.bootstrap import index_generations, keys_at
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.followers.memory_shards import MemoryShards, shard_of
from workers.processors.embedding import EmbeddingProcessor
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.runner import Runner

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EMBEDDER = OnnxMiniLM()


@pytest.fixture
async def deployment(settings, tmp_path):
    """Topics, a data directory and a key file of the test's own; its keys seal every event it
    publishes (`sealing`)."""
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}erase{uuid.uuid4().hex[:4]}.",
                                    "data_dir": tmp_path / "data", "key_file": tmp_path / "keys" / "memlane.key",
                                    "reconcile_every_s": 0.0, "memory_shards": 2})
    await ensure_topics(s)
    keys = await open_keys(s, keys_at(s)())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        yield s, keys, producer
    finally:
        await producer.stop()
        await keys.stop()


def record(rid: str, agent: str, text: str, user: str | None = None) -> MemoryRecord:
    return MemoryRecord(id=rid, version=1, created=T0, modified=T0, tenant="t", agent=agent,
                        scope="USER" if user else "AGENT", user=user, kind="fact", summary=text)


def added(r: MemoryRecord) -> RecordAdded:
    return RecordAdded(event_id=f"e-{r.agent}-{r.id}", command_id=f"c-{r.agent}-{r.id}", tenant=r.tenant,
                       agent=r.agent, occurred_at=T0, record=r)


def erased(agent: str, user: str | None) -> SubjectErased:
    return SubjectErased(event_id=f"x-{agent}-{user}", command_id=f"cx-{agent}-{user}", tenant="t", agent=agent,
                         occurred_at=T0, user=user)


def sealing(keys) -> Codec:
    """A codec over the test's keyring: what the ledger seals its events with."""
    return Codec(keys.keyring)


async def publish(s, keys, producer, *events) -> list:
    """Sealed as the ledger writes them: the keys they are sealed under go out first."""
    data = [(e, sealing(keys).encode(e)) for e in events]
    await keys.flush()
    out = []
    for e, raw in data:
        out.append(await producer.send_and_wait(s.topic(EVENTS.name), raw, key=EVENTS.key_bytes(e)))
    return out


async def read_vectors(s) -> list:
    """Every message of the vectors topic, in order per partition."""
    c = AIOKafkaConsumer(bootstrap_servers=s.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(s.topic(VECTORS.name), p) for p in range(VECTORS.partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        out = []
        while [tp for tp in tps if await c.position(tp) < end[tp]]:
            for ms in (await c.getmany(timeout_ms=500)).values():
                out += ms
        return out
    finally:
        await c.stop()


class Counting:
    """The real embedder, counting the texts it is asked to embed."""

    model_id, dim = MODEL_ID, 384

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts += list(texts)
        return EMBEDDER.embed(texts)


async def test_a_vector_belongs_to_its_subject_and_goes_with_it(deployment):
    s, keys, producer = deployment
    text = f"Ann likes green tea {uuid.uuid4().hex[:6]}"
    records = [record("ann1", "a", text, "ann"), record("ann2", "a", text, "ann"), record("bob1", "a", text, "bob"),
               record("shared", "a", text)]
    await publish(s, keys, producer, *map(added, records))
    embedder = Counting()
    runner = Runner(EmbeddingProcessor(s, embedder, codec=sealing(keys)), s, group=f"{s.group_prefix}.embed.{uuid.uuid4().hex[:6]}")
    task = asyncio.create_task(runner.run())
    try:
        async def three_subjects():
            got = [m for m in await read_vectors(s) if m.value is not None]
            return got if len({decode_lean_vector(m.value).subject for m in got}) == 3 else None

        vectors = await eventually(three_subjects, timeout=60)
        # Named by a hash keyed by each subject's data key: the plain hash of the text names none,
        # ann's two records share one vector, and each of three subjects has its own.
        plain = hashlib.sha256(text.encode()).hexdigest()[:32]
        by_subject = {decode_lean_vector(m.value).subject: m for m in vectors}
        assert set(by_subject) == {subject_of("t", "a", "ann"), subject_of("t", "a", "bob"), subject_of("t", "a")}
        assert len({m.key for m in vectors}) == 3 and all(plain.encode() not in m.key for m in vectors)
        assert sorted(embedder.texts) == [text] * 3  # once per subject
        for m in vectors:
            v = decode_lean_vector(m.value)
            assert v.dense == b"" and v.sealed and text.split()[-1].encode() not in m.value
            assert list(v.floats(keys.keyring)) == pytest.approx(EMBEDDER.embed([text])[0], abs=1e-6)
        ann = by_subject[subject_of("t", "a", "ann")]

        await publish(s, keys, producer, erased("a", "ann"))

        async def tombstoned():
            after = await read_vectors(s)
            return [m for m in after if m.value is None]

        [tomb] = await eventually(tombstoned, timeout=60)
        assert (tomb.key, tomb.partition) == (ann.key, ann.partition)
    finally:
        runner.stopping.set()
        await task
    # Once ann's keys are destroyed her vector is unreadable for good; the others are not.
    await keys.destroy(subject_of("t", "a", "ann"))
    with pytest.raises(KeyDestroyed):
        decode_lean_vector(ann.value).floats(keys.keyring)
    decode_lean_vector(by_subject[subject_of("t", "a", "bob")].value).floats(keys.keyring)


def agents_on_two_shards() -> tuple[str, str]:
    names = [f"ag{i}" for i in range(100)]
    first = next(a for a in names if shard_of("t", a, 2) == 0)
    return first, next(a for a in names if shard_of("t", a, 2) == 1)


def points(shards: MemoryShards, agent: str) -> set[str]:
    return shards.of("t", agent).index.record_ids("t", agent)


async def test_an_erasure_of_a_member_on_every_agent_reaches_every_shard(deployment):
    s, keys, producer = deployment
    a, b = agents_on_two_shards()
    records = [record("ann-a", a, "ann's note on a", "ann"), record("bob-a", a, "bob's note on a", "bob"),
               record("ann-b", b, "ann's note on b", "ann"), record("team-b", b, "the team's note on b")]
    written = await publish(s, keys, producer, *map(added, records))
    for r, md in zip(records, written):
        _, h, subject = as_lean(added(r), sealing(keys)).record.vector_of(keys.keyring)
        v = VectorComputed.of(MODEL_ID, h, EMBEDDER.embed([r.text])[0], subject, keys.keyring)
        await producer.send_and_wait(s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v),
                                     partition=vector_partition(md.partition))
    shards = MemoryShards(s, index_generations(s), 1, redis_at(s.redis_url), keys=keys, codec=sealing(keys))
    task = asyncio.create_task(shards.run())
    try:
        await eventually(lambda: points(shards, a) == {"ann-a", "bob-a"} and points(shards, b) == {"ann-b", "team-b"},
                         timeout=60)
        f = SearchFilter(tenant="t", agent=b, scopes=("AGENT", "USER"), session=None, preview=False, user="ann")
        assert "ann-b" in [h.record_id for h in shards.search(f, None, "ann's note", 5, "lexical")]
        # Under the workspace agent: its partition is one shard's, the member is on both.
        await publish(s, keys, producer, erased(WORKSPACE, "ann"))
        await eventually(lambda: points(shards, a) == {"bob-a"} and points(shards, b) == {"team-b"}, timeout=60)
        assert [h.record_id for h in shards.search(f, None, "ann's note", 5, "lexical")] == ["team-b"]
        # Every shard saves its checkpoint again (none is held back by a peer's purge).
        await eventually(lambda: all(not p.awaiting for p in shards.projections), timeout=30)
    finally:
        shards.stop()
        await task
        shards.close()

    # Ann's keys destroyed: a generation built from the log skips her records, and counts them.
    for agent in (a, b):
        await keys.destroy(subject_of("t", agent, "ann"))
    fresh = MemoryShards(s, index_generations(s), 2, redis_at(s.redis_url), keys=keys, codec=sealing(keys))
    task = asyncio.create_task(fresh.run())
    try:
        await fresh.caught_up()
        assert points(fresh, a) == {"bob-a"} and points(fresh, b) == {"team-b"}
        assert fresh.status()["unreadable"] >= 2
    finally:
        fresh.stop()
        await task
        fresh.close()


async def test_the_record_view_holds_no_plaintext_and_leaves_out_what_it_cannot_open(deployment):
    s, keys, producer = deployment
    canary = f"zq{uuid.uuid4().hex}"
    ann, team = record("ann1", "a", f"ann's locker is {canary}", "ann"), record("team1", "a", "the team meets at nine")
    block = BlockChanged(event_id="b1", command_id="cb1", tenant="t", agent="a", occurred_at=T0, label="style",
                         text=f"Tabs, says {canary}")
    events = [as_lean(e, sealing(keys)) for e in (added(ann), added(team), block)]
    await keys.flush()
    view = RedisRecords(redis_at(s.redis_url)(pooled=True), generation=1, namespace=s.topic_prefix, keys=keys,
                        codec=sealing(keys))
    try:
        await view.apply(events, [("ev:0", 3)])
        stored = [v for k in [k async for k in view.r.scan_iter(f"ml:{s.topic_prefix}*")]
                  for v in ((await view.r.hgetall(k)).values() if await view.r.type(k) == "hash" else [])]
        assert stored and not [v for v in stored if canary in v]
        assert (await view.get("t", "a", "ann1")).summary == ann.summary
        assert await view.blocks("t", "a") == {"style": block.text}

        await keys.destroy(subject_of("t", "a", "ann"))
        assert await view.get("t", "a", "ann1") is None and view.unreadable == 1
        assert [r.id for r in (await view.page("t", "a", 10)).records] == ["team1"]
        # A generation filled afterwards stores nothing of ann's.
        again = RedisRecords(redis_at(s.redis_url)(pooled=True), generation=2, namespace=s.topic_prefix, keys=keys,
                             codec=sealing(keys))
        try:
            await again.fill(events, [("ev:0", 3)])
            assert again.unreadable == 1
            assert sorted(await again.r.hkeys(f"ml:{s.topic_prefix}g2:rec:{{t/a}}")) == ["team1", "team1#1"]
            assert await again.blocks("t", "a") == {"style": block.text}  # the agent's: its key stays
        finally:
            await again.aclose()
    finally:
        for g in await view.generations():
            await view.drop_generation(g)
        await view.aclose()
