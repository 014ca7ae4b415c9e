"""A turn whose outcome never comes is discarded after the timeout even when its agent goes
quiet: the ledger sends itself an `ExpireTurns` command, through Kafka, and decides it like
any other command."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from aiokafka import AIOKafkaProducer

from events import AddMemory, TurnOutcome, encode
from events.base import utcnow
from events.rules.ledger import TURN_TIMEOUT
from events.topics import COMMANDS, EVENTS
from services.bootstrap import keys_at
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import read_topic
from workers.processors.ledger.processor import LedgerProcessor
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.runner import Runner


async def test_a_quiet_agents_overdue_turn_is_discarded_and_an_answered_one_is_kept(settings):
    s = Settings(topic_prefix=f"{settings.topic_prefix}tt{uuid.uuid4().hex[:6]}.", data_dir=settings.data_dir)
    await ensure_topics(s)
    now = utcnow()

    def write(agent: str, ref: str) -> AddMemory:
        return AddMemory(command_id=f"w-{agent}", tenant="t", agent=agent, issued_at=now, session="s1",
                         summary=f"written by {agent} during its turn", turn_ref=ref)

    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        for cmd in (write("quiet", "e:1:1"), write("answered", "e:2:1"),
                    TurnOutcome(command_id="o-answered", tenant="t", agent="answered", issued_at=now,
                                turn_ref="e:2:1", committed=True)):
            await p.send_and_wait(s.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
    finally:
        await p.stop()

    ledger = LedgerProcessor(s, codec=keys_at(s)())
    ledger.tick_every = 0.2
    ledger.clock = lambda: utcnow() + TURN_TIMEOUT + timedelta(seconds=1)  # the timeout has passed
    task = asyncio.create_task(Runner(ledger, s).run())
    try:
        async def decided():
            made = {(e.agent, e.type) for e, _ in await read_topic(s, EVENTS.name, EVENTS.name)}
            return made if ("quiet", "WriteDiscarded") in made else None

        made = await eventually(decided, timeout=60)
    finally:
        ledger.stopping.set()
        await asyncio.wait_for(task, 30)
    assert made == {("quiet", "WriteStaged"), ("quiet", "TurnResolved"), ("quiet", "WriteDiscarded"),
                    ("answered", "WriteStaged"), ("answered", "TurnResolved"), ("answered", "RecordAdded")}
    [discarded] = [e for e, _ in await read_topic(s, EVENTS.name, EVENTS.name) if e.type == "WriteDiscarded"]
    assert discarded.reason == "turn timed out: no outcome within 600 s"
    expiries = [c for c, _ in await read_topic(s, COMMANDS.name, COMMANDS.name) if c.type == "ExpireTurns"]
    assert [c.agent for c in expiries] == ["quiet"]  # asked once, only for the agent with an open turn
    assert not ledger.states[COMMANDS.partition_of(COMMANDS.key_bytes(expiries[0]))].open_turns
