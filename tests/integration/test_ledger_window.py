"""The idempotency window is a time, not a memory budget: a command redelivered after its events
left the ledger's memory (within a day of its decision) is answered with those events, read back
from the real event log, on the replies topic, and decided nothing again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer

from events import AddMemory
from events.rules.ledger import LedgerState
from events.topics import COMMANDS, EVENTS, REPLIES
from services.bootstrap import keys_at
from settings import Settings
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands
from workers.runtime.kafka_io import ensure_topics

NOW = datetime(2026, 3, 1, tzinfo=UTC)


async def test_a_retry_past_the_held_events_is_answered_with_its_events_read_from_the_log(settings):
    s = Settings(topic_prefix=f"{settings.topic_prefix}window{uuid.uuid4().hex[:6]}.", encryption=False)
    await ensure_topics(s)
    ledger = LedgerProcessor(s, codec=keys_at(s)())

    def cmd(cid: str, summary: str) -> AddMemory:
        return AddMemory(command_id=cid, tenant="t", agent="a", issued_at=NOW, summary=summary, session="s1")

    first_cmd = cmd("c1", "Kept for a day")
    p = COMMANDS.partition_of(COMMANDS.key_bytes(first_cmd))
    # A memory of one byte: each command's events push the one before out of it.
    ledger.states[p], ledger.processed[p] = LedgerState(), RecentCommands(budget=1)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        async def decided(c: AddMemory, offset: int) -> list:
            outs = await ledger.process(COMMANDS.name, p, offset, c)
            for o in outs:  # as the runner sends them
                await producer.send_and_wait(s.topic(o.topic), o.value, key=o.key, headers=list(o.headers),
                                             partition=o.partition if o.partition is not None else p)
            return outs

        first = await decided(first_cmd, 0)
        await decided(cmd("c2", "Another fact"), 1)
        held = ledger.processed[p]
        assert len(held.events) == 1
        assert len(held.older) == 1  # c1: its caller and time only
        again = await decided(first_cmd, 2)
    finally:
        await producer.stop()
    assert first and {o.topic for o in first} == {EVENTS.name}
    assert [o.value for o in again] == [o.value for o in first] and {o.topic for o in again} == {REPLIES.name}
    assert len(ledger.states[p].records) == 2  # decided once
