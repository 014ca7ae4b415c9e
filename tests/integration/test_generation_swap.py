"""A caller waiting on the memory shards across a generation swap still hears back: the
old shards keep following the log until their waiters are answered (regression: they
stopped at the swap, and a command sent just before it timed out after 30 s)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import numpy as np
from aiokafka import AIOKafkaProducer

from events import RecordAdded, encode
from events.codec import PLAIN
from events.lean import as_lean
from events.record import MemoryRecord
from events.topics import EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID
from services.bootstrap import index_generations
from services.http.shards import ShardOwner
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.runtime.kafka_io import ensure_topics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_command_answered_after_the_swap_reaches_its_caller(settings, tmp_path):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}swap{uuid.uuid4().hex[:4]}.",
                                    "data_dir": tmp_path})
    await ensure_topics(s)
    owner = ShardOwner(s, index_generations(s), redis_at(s.redis_url), PLAIN)  # the test publishes plaintext
    await owner.open(1)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        await owner.memory.caught_up()
        waiting = owner.memory.wait_for("c1", "t", "a")
        swap = asyncio.create_task(owner.open(2))
        await eventually(lambda: owner.generation == 2, timeout=60)
        # Applied only after the swap: the caller registered on generation 1's shards.
        r = MemoryRecord(id="r1", version=1, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                         kind="fact", summary="sent just before a swap")
        e = RecordAdded(event_id="e1", command_id="c1", tenant="t", agent="a", occurred_at=T0, record=r)
        _, h, subject = as_lean(e).record.vector_of(None)
        v = VectorComputed.of(MODEL_ID, h, np.ones(384, dtype=np.float32), subject, None)
        key = EVENTS.key_bytes(e)
        await producer.send_and_wait(s.topic(EVENTS.name), encode(e), key=key)
        await producer.send_and_wait(s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v),
                                     partition=vector_partition(EVENTS.partition_of(key)))
        events = await asyncio.wait_for(waiting, timeout=20)
        assert [x.record.id for x in events] == ["r1"]
        await swap
    finally:
        await producer.stop()
        await owner.close()
