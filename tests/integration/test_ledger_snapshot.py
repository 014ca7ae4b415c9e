"""A ledger snapshots its partitions as it goes, and a recovery folds only the events after
the snapshot, into the same state as a fold of the whole partition. A snapshot whose last
event is not in the log is ignored."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import msgspec
from aiokafka import AIOKafkaProducer

from events import AddMemory, TurnOutcome, encode
from events.rules.ledger import LedgerState
from events.topics import COMMANDS, EVENTS
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import read_topic
from workers import ledger_snapshot
from workers.kafka_io import ensure_topics
from workers.ledger import LedgerProcessor
from workers.runtime import Runner

T0 = datetime(2026, 3, 1, tzinfo=UTC)
FIELDS = ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "stats")


def same_state(a: LedgerState, b: LedgerState) -> None:
    for name in FIELDS:
        assert dict(getattr(a, name)) == dict(getattr(b, name)), name
    assert a.turns_since == b.turns_since


async def send(s: Settings, cmds: list) -> None:
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        for cmd in cmds:
            await p.send_and_wait(s.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
    finally:
        await p.stop()


def commands(agent: str, n: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + n):
        out.append(AddMemory(command_id=f"{agent}-w{i}", tenant="t", agent=agent, issued_at=T0, session="s",
                             summary=f"fact {i} of {agent}", turn_ref=f"e:{i}:1"))
        out.append(TurnOutcome(command_id=f"{agent}-o{i}", tenant="t", agent=agent, issued_at=T0,
                               turn_ref=f"e:{i}:1", committed=i % 3 != 0))
    return out


async def test_recovery_starts_at_the_snapshot_and_folds_to_the_same_state(settings, tmp_path):
    s = Settings(topic_prefix=f"{settings.topic_prefix}snap{uuid.uuid4().hex[:6]}.", data_dir=tmp_path)
    await ensure_topics(s)
    agent = "snapper"
    partition = COMMANDS.partition_of(COMMANDS.key_bytes(commands(agent, 1)[0]))
    path = ledger_snapshot.path_for(s, partition)
    await send(s, commands(agent, 20))

    ledger = LedgerProcessor(s)
    ledger.snapshot_every = 10
    task = asyncio.create_task(Runner(ledger, s).run())
    try:
        await eventually(path.exists, timeout=60)
        await send(s, commands(agent, 5, start=20))  # after the snapshot: the recovery's part

        async def all_decided():
            events = [e for e, _ in await read_topic(s, EVENTS.name, EVENTS.name) if e.agent == agent]
            return events if sum(e.type == "TurnResolved" for e in events) == 25 else None

        events = await eventually(all_decided, timeout=60)
    finally:
        ledger.stopping.set()
        await asyncio.wait_for(task, 30)
    live = ledger.states[partition]
    snap = ledger_snapshot.read(path)
    assert snap is not None and 0 < snap.next_offset

    recovered = LedgerProcessor(s)
    n = await recovered._recover(partition)
    assert 0 < n < len(events)  # only what came after the snapshot
    same_state(recovered.states[partition], live)
    assert list(recovered.processed[partition].events) == list(ledger.processed[partition].events)

    # Without the snapshot, the whole partition folds to the same state.
    whole = LedgerProcessor(Settings(topic_prefix=s.topic_prefix, data_dir=tmp_path / "elsewhere"))
    assert await whole._recover(partition) == len(events)
    same_state(whole.states[partition], live)

    # A snapshot whose last event is not the log's (a topic made again) is ignored.
    path.write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(snap, last_sha="0" * 64)))
    stale = LedgerProcessor(s)
    assert await stale._recover(partition) == len(events)
    same_state(stale.states[partition], live)
