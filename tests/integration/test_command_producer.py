"""A command the broker refuses fails alone: later commands on its partition still go out.

The broker here refuses messages over 4,000 bytes on the commands topic (a topic setting),
so a command within memlane's own limits is refused by the broker itself, after the
idempotent producer gave it a sequence number.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from events import AddMemory
from events.codec import PLAIN, decode
from events.topics import COMMANDS
from services.errors import ApiError
from services.memory.commands import MemoryCommands
from services.memory.kafka import KafkaCommandPublisher
from workers.runtime.kafka_io import ensure_topics, producer, reader

NOW = datetime(2026, 3, 1, tzinfo=UTC)


async def test_a_refused_send_does_not_poison_later_sends(settings):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}prod{uuid.uuid4().hex[:4]}."})
    admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(s.topic(COMMANDS.name), COMMANDS.partitions, 1,
                                            topic_configs={"max.message.bytes": "4000"})])
    finally:
        await admin.close()
    await ensure_topics(s)
    first = producer(s)
    await first.start()
    publisher = KafkaCommandPublisher(s, first, PLAIN)
    svc = MemoryCommands(s, None, None, publisher)
    try:
        def cmd(summary: str, content: str = "") -> AddMemory:
            return AddMemory(command_id=str(uuid.uuid4()), tenant="t", agent="a", issued_at=NOW, summary=summary,
                             content=content, session="s1")

        # Same agent, so the same partition: the broker knows the producer's sequence there.
        sent = [cmd(f"a normal write {i}") for i in range(4)]
        assert (await svc.submit(sent[0], wait=False))["status"] == "accepted"
        with pytest.raises(ApiError) as e:
            await svc.submit(cmd("too big for this broker", "x" * 8000), wait=False)
        assert (e.value.status, e.value.code, e.value.field) == (413, "LIMIT_EXCEEDED", "content")
        for c in sent[1:]:
            assert (await svc.submit(c, wait=False))["status"] == "accepted"
        assert publisher.producer is not first
    finally:
        await publisher.stop()
        await first.stop()
    c = reader(s)
    await c.start()
    try:
        from aiokafka import TopicPartition

        tp = TopicPartition(s.topic(COMMANDS.name), COMMANDS.partition_of(b"t/a"))
        c.assign([tp])
        await c.seek_to_beginning(tp)
        got = []
        while len(got) < len(sent):
            batch = await c.getmany(tp, timeout_ms=5000)
            assert batch, f"only {len(got)} of {len(sent)} commands in the log"
            got += [decode(COMMANDS.name, m.value).summary for m in batch[tp]]
        assert got == [x.summary for x in sent]
    finally:
        await c.stop()
