"""A ledger snapshots its partitions as it goes, and a recovery folds only the events after
the snapshot, into the same state as a fold of the whole partition. A snapshot whose last
event is not in the log is ignored, and holds no plaintext. Who gave each recent command
survives both recoveries."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from functools import partial

import msgspec
from aiokafka import AIOKafkaProducer

from events import AddMemory, AgentConfig, ConfigureAgent, TurnOutcome, encode
from events.record import Provenance, Source
from events.rules.ledger import LedgerState
from events.topics import COMMANDS, EVENTS
from services.bootstrap import keys_at
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import read_topic
from workers.processors.ledger import snapshot_file as ledger_snapshot
from workers.processors.ledger.processor import LedgerProcessor, caller_of
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.runner import Runner

T0 = datetime(2026, 3, 1, tzinfo=UTC)
FIELDS = ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "stats")


def same_state(a: LedgerState, b: LedgerState) -> None:
    for name in FIELDS:
        assert dict(getattr(a, name)) == dict(getattr(b, name)), name
    assert a.turns_since == b.turns_since


def ledger_of(s: Settings) -> LedgerProcessor:
    """A ledger with a codec of its own, as the composition root builds it."""
    return LedgerProcessor(s, codec=keys_at(s)())


async def keyed(ledger: LedgerProcessor) -> LedgerProcessor:
    """A ledger recovered outside a runner, with its codec's keys loaded as a runner loads them."""
    ledger.keys = await open_keys(ledger.settings, ledger.codec, follow=False)
    return ledger


async def stopped(*ledgers: LedgerProcessor) -> None:
    for ledger in ledgers:
        await ledger.keys.stop()


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

    ledger = ledger_of(s)
    ledger.snapshot_every = 10
    task = asyncio.create_task(Runner(ledger, s).run())
    try:
        await eventually(path.exists, timeout=60)
        first = path.read_bytes()
        assert b"of snapper" not in first and b"fact 1" not in first  # the facts are sealed
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

    recovered = await keyed(ledger_of(s))
    n = await recovered._recover(partition)
    assert 0 < n < len(events)  # only what came after the snapshot
    same_state(recovered.states[partition], live)
    assert list(recovered.processed[partition].events) == list(ledger.processed[partition].events)

    # Without the snapshot, the whole partition folds to the same state.
    whole = await keyed(ledger_of(Settings(topic_prefix=s.topic_prefix, data_dir=tmp_path / "elsewhere")))
    assert await whole._recover(partition) == len(events)
    same_state(whole.states[partition], live)

    # A snapshot whose last event is not the log's (a topic made again) is ignored.
    path.write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(snap, last_sha="0" * 64)))
    stale = await keyed(ledger_of(s))
    assert await stale._recover(partition) == len(events)
    same_state(stale.states[partition], live)
    await stopped(recovered, whole, stale)


async def test_a_restarted_ledger_still_refuses_another_callers_reuse_of_a_command_id(settings, tmp_path):
    """Who gave each command rides on its events (a header), so a ledger that folded the log
    again, from the start or from a snapshot, still answers a retry with the events and
    another member's reuse of the id with a refusal, never with the first member's record."""
    s = Settings(topic_prefix=f"{settings.topic_prefix}reuse{uuid.uuid4().hex[:6]}.", data_dir=tmp_path)
    await ensure_topics(s)
    agent = "reuser"
    scopes = {"read": ["user"], "write": ["user"]}
    config = ConfigureAgent(command_id="cfg", tenant="t", agent=agent, issued_at=T0,
                            config=AgentConfig.model_validate({"memory": {"scope": scopes}}))
    alice = AddMemory(command_id="idem-1", tenant="t", agent=agent, issued_at=T0, user="alice", session="s1",
                      summary="Alice's PIN hint is her cat's name",
                      provenance=Provenance(source=Source.TOOL, user="alice", session="s1"))
    bob = alice.model_copy(update={"user": "bob", "provenance": Provenance(source=Source.TOOL, user="bob",
                                                                           session="s1")})
    partition = COMMANDS.partition_of(COMMANDS.key_bytes(alice))
    await send(s, [config, alice])

    ledger = ledger_of(s)
    task = asyncio.create_task(Runner(ledger, s).run())
    try:
        async def added():
            got = [(e, h) for e, h in await read_topic(s, EVENTS.name, EVENTS.name) if e.agent == agent]
            return got if any(e.type == "RecordAdded" for e, _ in got) else None

        logged = await eventually(added, timeout=60)
    finally:
        ledger.stopping.set()
        await asyncio.wait_for(task, 30)
    [(original, headers)] = [(e, h) for e, h in logged if e.command_id == "idem-1"]
    assert original.record.user == "alice" and caller_of(headers)  # the header is in the log

    async def answers(recovered: LedgerProcessor, offset: int) -> None:
        [e] = [recovered.codec.decode(EVENTS.name, o.value)
               for o in await recovered.process(COMMANDS.name, partition, offset, bob)]
        assert (e.type, e.code, e.field) == ("CommandRejected", "DUPLICATE_ID", "command_id")
        retry = alice.model_copy(update={"issued_at": T0.replace(minute=5)})
        [again] = [recovered.codec.decode(EVENTS.name, o.value)
                   for o in await recovered.process(COMMANDS.name, partition, offset + 1, retry)]
        assert again == original

    whole = await keyed(ledger_of(s))
    whole.snapshot_every = 1  # and leaves a snapshot of what it folded
    assert await whole._recover(partition) == len(logged)
    await answers(whole, 100)
    from_snapshot = await keyed(ledger_of(s))
    assert await from_snapshot._recover(partition) == 0
    await answers(from_snapshot, 200)
    await stopped(whole, from_snapshot)


async def test_a_malformed_event_on_the_log_is_skipped_and_the_partition_still_recovers(settings, tmp_path):
    """Bytes another producer put on the event log (no tenant, not an event at all) stop no
    recovery: the ledger folds the rest into the state it had, and goes on deciding."""
    s = Settings(topic_prefix=f"{settings.topic_prefix}bad{uuid.uuid4().hex[:6]}.", data_dir=tmp_path)
    await ensure_topics(s)
    agent = "survivor"
    partition = COMMANDS.partition_of(COMMANDS.key_bytes(commands(agent, 1)[0]))
    await send(s, commands(agent, 3))
    ledger = ledger_of(s)
    task = asyncio.create_task(Runner(ledger, s).run())
    try:
        async def decided():
            events = [e for e, _ in await read_topic(s, EVENTS.name, EVENTS.name) if e.agent == agent]
            return events if sum(e.type == "TurnResolved" for e in events) == 3 else None

        await eventually(decided, timeout=60)
    finally:
        ledger.stopping.set()
        await asyncio.wait_for(task, 30)
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        for junk in (b'{"type": "RecordAdded", "event_id": "x"}', b"\xff not json"):
            await p.send_and_wait(s.topic(EVENTS.name), junk, partition=partition)
    finally:
        await p.stop()

    recovered = await keyed(ledger_of(s))
    assert await recovered._recover(partition) > 0
    same_state(recovered.states[partition], ledger.states[partition])
    await stopped(recovered)


async def test_a_partition_handed_back_folds_only_what_another_owner_wrote_meanwhile(settings, tmp_path):
    from aiokafka import TopicPartition

    s = Settings(topic_prefix=f"{settings.topic_prefix}kept{uuid.uuid4().hex[:6]}.", data_dir=tmp_path / "first")
    await ensure_topics(s)
    agent = "keeper"
    partition = COMMANDS.partition_of(COMMANDS.key_bytes(commands(agent, 1)[0]))

    async def decided(n: int):
        events = [e for e, _ in await read_topic(s, EVENTS.name, EVENTS.name) if e.agent == agent]
        return events if sum(e.type == "TurnResolved" for e in events) == n else None

    async def run(ledger: LedgerProcessor, settings: Settings, n: int) -> list:
        task = asyncio.create_task(Runner(ledger, settings).run())
        try:
            return await eventually(partial(decided, n), timeout=60)
        finally:
            ledger.stopping.set()
            await asyncio.wait_for(task, 30)

    await send(s, commands(agent, 10))
    first = ledger_of(s)  # no snapshot file: its default interval is far off
    before = await run(first, s, 10)
    await first.revoked({TopicPartition(s.topic(COMMANDS.name), partition)})  # as a rebalance takes it
    assert partition in first.kept and partition not in first.states

    # Meanwhile another owner decides more of the partition, then hands it back.
    await send(s, commands(agent, 5, start=10))
    second = ledger_of(Settings(topic_prefix=s.topic_prefix, data_dir=tmp_path / "second"))
    after = await run(second, s, 15)
    await keyed(first)
    first.stopping.clear()  # the worker runs on: only its runner for the partition stopped
    try:
        assert await first._recover(partition) == len(after) - len(before)  # the gap, not the partition
    finally:
        await stopped(first)
    same_state(first.states[partition], second.states[partition])
    assert list(first.processed[partition].events) == list(second.processed[partition].events)
