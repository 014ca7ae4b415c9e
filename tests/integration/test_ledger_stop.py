"""A ledger told to stop while it recovers gives up at once and takes no command it cannot decide."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaProducer

from events import AddMemory, encode
from events.rules.ledger import LedgerState, decide, evolve
from events.topics import COMMANDS, EVENTS
from services.bootstrap import keys_at
from settings import Settings
from workers.processors.ledger.processor import LedgerProcessor
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.runner import Stopping

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

    ledger = LedgerProcessor(s, codec=keys_at(s)())
    ledger.stopping.set()
    await ledger._recover(partition)
    assert partition not in ledger.states
    with pytest.raises(Stopping):
        await ledger.process(COMMANDS.name, partition, 0, cmds[3])

    ledger.stopping.clear()  # the same log, not stopping: it recovers every record
    await ledger._recover(partition)
    assert len(ledger.states[partition].records) == len(state.records) == 3


async def test_a_command_during_its_partitions_assignment_recovers_the_partition_once(settings):
    """A poll can hand the ledger a partition's command while the assignment still recovers
    it: both wait for one recovery, and the state the command folds into is the one kept."""
    from aiokafka import TopicPartition

    s = Settings(topic_prefix=f"{settings.topic_prefix}once{uuid.uuid4().hex[:6]}.", data_dir=settings.data_dir)
    await ensure_topics(s)
    ledger = LedgerProcessor(s, codec=keys_at(s)())
    calls, recover = [], ledger._recover

    async def counted(partition: int) -> int:
        calls.append(partition)
        return await recover(partition)

    ledger._recover = counted
    assignment = asyncio.create_task(ledger.assigned(None, {TopicPartition(s.topic(COMMANDS.name), 3)}))
    await asyncio.sleep(0)  # the assignment's recovery is under way
    cmd = AddMemory(command_id="c", tenant="t", agent="a", issued_at=T0, session="s", summary="fact", turn_ref="x:1:1")
    [staged] = await ledger.process(COMMANDS.name, 3, 0, cmd)
    await assignment
    assert calls == [3]
    assert ledger.states[3].open_turns == {"t/a": {"t/a|x:1:1": T0}}


async def test_recovery_skips_the_events_a_redelivered_command_wrote_again(settings):
    from events.topics import REDELIVERED

    s = Settings(topic_prefix=f"{settings.topic_prefix}redel{uuid.uuid4().hex[:6]}.", data_dir=settings.data_dir)
    await ensure_topics(s)
    cmd = AddMemory(command_id="w", tenant="t", agent="a", issued_at=T0, session="s", summary="staged", turn_ref="x:1:1")
    [staged] = decide(LedgerState(), cmd)
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        first = await p.send_and_wait(s.topic(EVENTS.name), encode(staged), key=EVENTS.key_bytes(staged))
        await p.send_and_wait(s.topic(EVENTS.name), encode(staged), key=EVENTS.key_bytes(staged),
                              headers=[(REDELIVERED, b"1")])
    finally:
        await p.stop()
    ledger = LedgerProcessor(s, codec=keys_at(s)())
    assert await ledger._recover(first.partition) == 2
    assert ledger.states[first.partition].staged == {"t/a|x:1:1": [staged.command]}  # staged once, as live
