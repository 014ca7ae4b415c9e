"""The reconciler of the serving process finds points lost or left behind whatever the
cause, heals them from the record view, and counts what it healed in the shards' status
(which /health reports). Real broker, Redis and Edge shards."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer

from events import RecordAdded, RecordDeleted, encode
from events.codec import PLAIN
from events.lean import as_lean
from events.record import MemoryRecord, Status
from events.topics import EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders.onnx import OnnxMiniLM
from projections.embedders.port import MODEL_ID
from projections.qdrant.index import SearchFilter
from projections.redis.record_view import RedisRecords
from services.bootstrap import index_generations
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.followers.memory_shards import MemoryShards
from workers.runtime.kafka_io import ensure_topics

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EMBEDDER = OnnxMiniLM()
TEXTS = ["the invoice service runs on port 8443", "Dana prefers tea over coffee",
         "the staging database is venus-db", "the old office was in Leeds", "backups run at 02:00 UTC"]


def record(i: int, version: int = 1, status: Status = Status.ACTIVE) -> MemoryRecord:
    return MemoryRecord(id=f"r{i}", version=version, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                        kind="fact", summary=TEXTS[i], status=status)


class Stack:
    """Events in the log and in the record view (as the Redis projection writes them),
    their vectors beside them, and the memory shards of a serving process."""

    def __init__(self, settings, tmp_path) -> None:
        self.s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}recon{uuid.uuid4().hex[:4]}.",
                                             "data_dir": tmp_path, "reconcile_every_s": 0.0})

    async def __aenter__(self) -> Stack:
        await ensure_topics(self.s)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.s.kafka_bootstrap)
        await self.producer.start()
        self.view = RedisRecords(redis_at(self.s.redis_url)(pooled=True), namespace=self.s.topic_prefix)
        self.shards: MemoryShards | None = None
        return self

    async def __aexit__(self, *exc) -> None:
        if self.shards:
            self.shards.stop()
            await self.task
            self.shards.close()
        await self.producer.stop()
        await self.view.aclose()

    async def write(self, *records: MemoryRecord, vectors: bool = True) -> None:
        events, positions = [], []
        for r in records:
            kind = RecordDeleted if r.status is Status.DELETED else RecordAdded
            e = kind(event_id=f"e-{r.id}-{r.version}", command_id=f"c-{r.id}-{r.version}", tenant="t", agent="a",
                     occurred_at=T0, record=r)
            md = await self.producer.send_and_wait(self.s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e))
            events.append(as_lean(e))
            positions.append((f"{md.topic}:{md.partition}", md.offset + 1))
            if vectors and r.status is Status.ACTIVE:
                # Named as the projection names it: keyed by the record's data key when it is sealed.
                _, h, subject = as_lean(e).record.vector_of(None)
                v = VectorComputed.of(MODEL_ID, h, EMBEDDER.embed([r.text])[0], subject, None)
                await self.producer.send_and_wait(self.s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v),
                                                  partition=vector_partition(md.partition))
        await self.view.apply(events, positions)

    async def serve(self) -> MemoryShards:
        # The first pass at once: a served process waits a minute before it.
        at_once = self.s.model_copy(update={"reconcile_delay_s": 0.0})
        self.shards = MemoryShards(at_once, index_generations(at_once), 1, redis_at(self.s.redis_url), EMBEDDER,
                                   codec=PLAIN)  # the test writes plaintext
        self.task = asyncio.create_task(self.shards.run())
        await self.shards.caught_up()
        # The run at start has nothing to heal.
        await eventually(lambda: self.shards.reconciler.runs == 1, timeout=30)
        assert self.shards.status()["reconciled"]["healed"] == 0
        return self.shards


def nearest(shards: MemoryShards, text: str) -> list[str]:
    f = SearchFilter(tenant="t", agent="a", scopes=("AGENT",), session=None, preview=False)
    return [h.record_id for h in shards.search(f, EMBEDDER.embed([text])[0], text, 1, "vector", 0.99)]


async def test_a_lost_point_comes_back_and_a_stale_one_goes(settings, tmp_path):
    async with Stack(settings, tmp_path) as stack:
        await stack.write(record(0), record(1), record(2), record(3), record(3, 2, Status.DELETED))
        shards = await stack.serve()
        proj = shards.of("t", "a")
        assert proj.index.record_ids("t", "a") == {"r0", "r1", "r2"}

        # Behind the projection's back: r1's point is lost, and deleted r3 is a point again.
        proj.index.delete([("t", "a", "r1")])
        proj.index.upsert([(record(3), EMBEDDER.embed([TEXTS[3]])[0])])
        proj.vectors.clear()  # as after a restart: r1's vector is embedded again, to the same vector
        assert await shards.reconciler.run_once() == 2

        assert proj.index.record_ids("t", "a") == {"r0", "r1", "r2"}
        assert nearest(shards, TEXTS[1]) == ["r1"]
        reconciled = shards.status()["reconciled"]
        assert (reconciled["healed"], reconciled["added"], reconciled["removed"]) == (2, 1, 1)
        assert reconciled["last_run"] is not None
        assert await shards.reconciler.run_once() == 0  # nothing left to heal


async def test_a_record_whose_vector_never_comes_is_healed_on_the_next_visit(settings, tmp_path):
    """A record parked for its vector is usually a moment from joining it: the first visit
    leaves it; still parked, at the same version, on the next, it is embedded."""
    async with Stack(settings, tmp_path) as stack:
        await stack.write(record(0))
        shards = await stack.serve()
        proj = shards.of("t", "a")
        await stack.write(record(4), vectors=False)
        await eventually(lambda: proj.parked_count() == 1, timeout=30)
        assert await shards.reconciler.run_once() == 0
        assert await shards.reconciler.run_once() == 1
        assert proj.index.record_ids("t", "a") == {"r0", "r4"} and proj.parked_count() == 0
        assert nearest(shards, TEXTS[4]) == ["r4"]
        assert shards.status()["reconciled"]["healed"] == 1
