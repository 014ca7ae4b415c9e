"""A ledger told to stop while it recovers gives up at once and takes no command it cannot decide."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaProducer

from events import AddMemory, encode
from events.topics import COMMANDS, EVENTS
from services.settings import Settings
from workers.kafka_io import ensure_topics
from workers.ledger import LedgerProcessor
from workers.ledger_rules import LedgerState, decide, evolve
from workers.runtime import Stopping

T0 = datetime(2026, 3, 1, tzinfo=UTC)


async def test_stop_during_recovery_leaves_no_state_and_refuses_commands(settings):
    s = Settings(topic_prefix=f"{settings.topic_prefix}stop{uuid.uuid4().hex[:6]}.", data_dir=settings.data_dir)
    await ensure_topics(s)
    # A partition's log: three adds as the ledger would have written them.
    state, cmds = LedgerState(), [
        AddMemory(command_id=f"c{i}", tenant="t", agent="a", issued_at=T0, session="s", summary=f"fact {i}")
        for i in range(4)
    ]
    events = []
    for cmd in cmds[:3]:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        sent = [await p.send_and_wait(s.topic(EVENTS.name), encode(e), key=EVENTS.key_bytes(e)) for e in events]
    finally:
        await p.stop()
    partition = sent[0].partition

    ledger = LedgerProcessor(s)
    ledger.stopping.set()
    await ledger._recover(partition)
    assert partition not in ledger.states
    with pytest.raises(Stopping):
        await ledger.process(COMMANDS.name, partition, 0, cmds[3])

    ledger.stopping.clear()  # the same log, not stopping: it recovers every record
    await ledger._recover(partition)
    assert len(ledger.states[partition].records) == len(state.records) == 3
