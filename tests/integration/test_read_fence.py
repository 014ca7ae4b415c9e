"""The read fence of serve replicas: a replica reaches another's position only once the agent's
records before it are searchable here, not merely read (a record still waiting for its vector
holds the position back)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import numpy as np
from aiokafka import AIOKafkaProducer

from events import RecordAdded, encode
from events.codec import PLAIN
from events.record import MemoryRecord
from events.topics import EVENTS, VECTORS
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from projections.qdrant.index import SearchFilter
from services.bootstrap import index_generations
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.followers.memory_shards import MemoryShards
from workers.runtime.kafka_io import ensure_topics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_position_is_reached_once_the_agents_records_are_searchable(settings, tmp_path):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}fence{uuid.uuid4().hex[:4]}.",
                                    "data_dir": tmp_path, "encryption": False})
    await ensure_topics(s)
    shards = MemoryShards(s, index_generations(s), 1, redis_at(s.redis_url), codec=PLAIN)
    task = asyncio.create_task(shards.run())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        await shards.caught_up()
        r = MemoryRecord(id="r1", version=1, created=T0, modified=T0, tenant="t", agent="a", scope="AGENT",
                         kind="fact", summary="the release train leaves on Thursdays")
        e = RecordAdded(event_id="e1", command_id="c1", tenant="t", agent="a", occurred_at=T0, record=r)
        sent = await producer.send_and_wait(s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e))
        partition, _ = shards.position("t", "a")
        assert partition == sent.partition
        projection = shards.of("t", "a")
        # Read, but parked: its vector is not on the log yet.
        await eventually(lambda: projection.parked_count() == 1, timeout=30)
        neighbour = next(f"o{i}" for i in range(1000) if shards.position("t", f"o{i}")[0] == partition)
        await eventually(lambda: shards.position("t", neighbour)[1] > sent.offset, timeout=30)
        assert shards.position("t", "a")[1] <= sent.offset, "its parked record holds the agent's position back"
        assert not await shards.reach("t", "a", sent.offset + 1, timeout=0.5)

        v = VectorComputed.of(MODEL_ID, content_hash(r.text), np.ones(384, dtype=np.float32))
        await producer.send_and_wait(s.topic(VECTORS.name), encode(v), key=VECTORS.key_bytes(v),
                                     partition=sent.partition % VECTORS.partitions)
        assert await shards.reach("t", "a", sent.offset + 1, timeout=30)
        hits = shards.search(SearchFilter("t", "a", ("AGENT",), None, False), [1.0] * 384, "release train", 5)
        assert [h.record_id for h in hits] == ["r1"], "reached means searchable"
    finally:
        await producer.stop()
        shards.stop()
        await task
        shards.close()
