"""Two extraction workers in one consumer group share `memlane.turns`; one is killed (SIGKILL)
mid-burst and the other takes over its partitions: every turn still yields its one fact,
none is lost and none is written twice.

Each turn carries a marker of its own, and the scripted model answers a review holding that
marker with one fact whose summary holds the marker upper-cased: a later review, which is
shown that fact as an existing memory, never matches the earlier turn's route. The model
holds back its answers to the worker it kills, for the round the kill lands in, until the kill
(`Held`), so reviews are in flight, inside transactions that worker never commits, when it dies."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from events.record import Source
from events.topics import EVENTS, REDELIVERED, TURNS
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import new_agent, read_topic_at, turn
from tests.fakes.model_server import Delay, Held, Reply

PER_PARTITION = 3  # sessions per partition of `memlane.turns`
ROUNDS = 6  # turns per session; 8 x 3 x 6 = 144 facts, under the ledger's 200 live facts per agent
KILL_ROUND = 3  # the dead worker is killed while it reviews this round; later rounds are published after
REVIEW_DELAY_S = 0.5  # well within the model stack's call timeout (tests/stacks.MODEL_PROFILE)
# A dead transactional producer's open transaction keeps read_committed readers (the ledger)
# of the partitions it wrote from reading past it until the broker aborts it: the producer's
# transaction timeout (aiokafka's default, 60 s). Then the group's session timeout (10 s).
SETTLE_S = 180


# ------------------------------------------------------------------------ helpers (also the bench's)


def extraction_group(settings: Settings) -> str:
    """The extraction worker's consumer group (`workers.runtime.runner.Runner`)."""
    return f"{settings.group_prefix}.{settings.topic_prefix}extraction"


async def group_assignment(settings: Settings, group: str) -> tuple[str, list[list[int]]]:
    """The group's state and, per member, the partitions of `memlane.turns` it holds, from the
    broker's own description of the group."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        [resp] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    [g] = resp.groups
    state, members = g[2], g[5]
    topic = settings.topic(TURNS.name)
    out = []
    for m in members:
        raw = m[4]
        if not raw:
            out.append([])
            continue
        a = ConsumerProtocolMemberAssignment.decode(raw)
        out.append(sorted(p for t, ps in a.assignment if t == topic for p in ps))
    return state, out


def assigned_in_log(log: Path) -> list[int] | None:
    """The partitions the worker writing `log` was assigned last (its `partitions_assigned` line)."""
    if not log.exists():
        return None
    last = None
    for line in log.read_text(errors="replace").splitlines():
        if '"partitions_assigned"' in line:
            try:
                last = json.loads(line)["partitions"]
            except (ValueError, KeyError):
                continue
    return last


async def two_workers_share(settings: Settings, logs: tuple[Path, Path], timeout: float = 60) -> tuple[list[int], list[int]]:
    """Waits until the group is stable with two members that split all of `memlane.turns`
    between them, as each worker's log says too; returns each log's worker's partitions."""
    group = extraction_group(settings)
    everything = list(range(TURNS.partitions))

    async def shared():
        state, members = await group_assignment(settings, group)
        if state != "Stable" or len(members) != 2 or not all(members):
            return None
        a, b = assigned_in_log(logs[0]), assigned_in_log(logs[1])
        if not a or not b or set(a) & set(b) or sorted(a + b) != everything:
            return None
        if sorted(map(sorted, members)) != sorted(map(sorted, (a, b))):
            return None  # a log line not written yet for the current generation
        return a, b

    return await eventually(shared, timeout=timeout, interval=0.5)


async def one_worker_holds_all(settings: Settings, log: Path, timeout: float = 60) -> None:
    group = extraction_group(settings)
    everything = list(range(TURNS.partitions))

    async def alone():
        state, members = await group_assignment(settings, group)
        return state == "Stable" and members == [everything] and assigned_in_log(log) == everything

    await eventually(alone, timeout=timeout, interval=0.5)


def sessions_by_partition(tenant: str, agent: str, per_partition: int, tag: str = "s") -> dict[int, list[str]]:
    """`per_partition` session names for each partition of `memlane.turns` (turns are keyed by session)."""
    out: dict[int, list[str]] = {p: [] for p in range(TURNS.partitions)}
    i = 0
    while any(len(v) < per_partition for v in out.values()):
        s = f"{tag}{i}"
        p = TURNS.partition_of(f"{tenant}/{agent}/{s}".encode())
        if len(out[p]) < per_partition:
            out[p].append(s)
        i += 1
    return out


def fact_of(marker: str) -> str:
    # Upper case: a later review of the session is shown this fact, and must not match the route.
    return f"Ticket {marker.upper()} was escalated to the billing team"


def marker_of(fact: str) -> str:
    return fact.split()[1].lower()


def answer_with_fact(marker: str, message_id: str) -> Reply:
    return Reply({"candidates": [{"decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": "session",
                                  "summary": fact_of(marker), "content": "", "source_message_ids": [message_id]}]})


# ------------------------------------------------------------------------------------ the stack


@pytest.fixture(scope="module")
def rstack(model_stack):
    """The model stack and a second extraction worker beside its own: the same environment (same
    topics, same consumer group), its own log. The worker the test kills is started again after."""
    stack, msettings = model_stack
    second = Stack(stack.env, stack.log_dir / "second")
    second.start("extraction")
    try:
        yield stack, second, msettings
    finally:
        second.stop()
        if "extraction" not in stack.procs:
            stack.start("extraction")


async def test_a_killed_extraction_worker_s_partitions_are_taken_over_with_nothing_lost_or_doubled(rstack, fake):
    stack, second, settings = rstack
    first_log, second_log = stack.log_dir / "extraction.log", second.log_dir / "extraction.log"
    first_parts, second_parts = await two_workers_share(settings, (first_log, second_log))

    tenant, agent, _ = await new_agent(stack.api_url, settings.operator_key)
    sessions = sessions_by_partition(tenant, agent, PER_PARTITION)
    turns, facts = [], {}
    holds: dict[str, tuple[Held, Reply]] = {}
    for rnd in range(1, ROUNDS + 1):
        for p in sorted(sessions):
            for s in sessions[p]:
                m = f"mk{uuid.uuid4().hex[:12]}"
                t = turn(tenant, agent, s, rnd, f"{m}: please escalate my ticket to billing", "Escalated.")
                # Several answers: a turn the dead worker reviewed but never committed is reviewed again.
                # The dead worker's reviews of the kill's round are held until the kill: certainly
                # in flight then. The survivor's are not held, so none of its calls times out.
                reply = answer_with_fact(m, f"{s}-{rnd}-0")
                if rnd == KILL_ROUND and p in first_parts:
                    holds[m] = (Held(), reply)
                    fake.on(m, *[holds[m][0].answer] * 4)
                else:
                    fake.on(m, *[Delay(REVIEW_DELAY_S, reply)] * 4)
                turns.append((rnd, p, t))
                facts[t.event_id] = fact_of(m)

    async def added() -> list:
        return [(e, h) for _, _, e, h in await read_topic_at(settings, EVENTS.name, EVENTS.name)
                if e.agent == agent and type(e).__name__ == "RecordAdded"]

    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        # Mid-burst: the first rounds are done, the next is being reviewed, the rest is to come.
        await pub.publish_many([t for rnd, _, t in turns if rnd < KILL_ROUND])
        done_before = sum(rnd < KILL_ROUND for rnd, _, _ in turns)

        async def first_rounds_done():
            n = len(await added())
            return n if n >= done_before else None

        await eventually(first_rounds_done, timeout=60, interval=0.2)
        await pub.publish_many([t for rnd, _, t in turns if rnd == KILL_ROUND])
        # The kill lands while the dead worker's reviews of this round wait on the model (held):
        # their transactions are open, their turns uncommitted.
        in_flight = [facts[t.event_id] for rnd, p, t in turns if rnd == KILL_ROUND and p in first_parts]
        await eventually(lambda: any(fake.requests_with(marker_of(f)) for f in in_flight), timeout=30, interval=0.02)
        done_at_kill = len(await added())
        victim = stack.procs["extraction"]
        stack.kill("extraction", signal.SIGKILL)
        assert victim.returncode == -signal.SIGKILL
        for held, reply in holds.values():  # for the survivor's reviews of the dead worker's turns
            held.release(reply)
        # The rest, the dead worker's sessions included, before the group has noticed.
        await pub.publish_many([t for rnd, _, t in turns if rnd > KILL_ROUND])

    # The survivor holds every partition, the dead worker's included.
    await one_worker_holds_all(settings, second_log, timeout=60)

    seen: list = []

    async def all_facts():
        seen[:] = await added()
        return seen if len({e.record.summary for e, _ in seen}) >= len(facts) else None

    try:
        rows = await eventually(all_facts, timeout=SETTLE_S, interval=1.0)
    except AssertionError:
        missing = [(rnd, p) for rnd, p, t in turns if facts[t.event_id] not in {e.record.summary for e, _ in seen}]
        raise AssertionError(f"{len(missing)} of {len(facts)} turns never made their fact (round, partition): "
                             f"{missing[:20]}; partitions {first_parts} were the dead worker's") from None

    # Nothing written twice: one RecordAdded per fact, no event written again for a
    # redelivered command, and the outcome of each turn resolved once.
    summaries = [e.record.summary for e, _ in rows]
    doubled = {s for s in summaries if summaries.count(s) > 1}
    assert not doubled, f"{len(doubled)} facts written more than once"
    assert sorted(summaries) == sorted(facts.values())
    assert all(e.record.provenance.source is Source.EXTRACTION for e, _ in rows)
    events = [(e, h) for _, _, e, h in await read_topic_at(settings, EVENTS.name, EVENTS.name) if e.agent == agent]
    again = Counter(type(e).__name__ for e, h in events if (REDELIVERED, b"1") in (h or ()))
    assert not again, f"events written again for redelivered commands: {dict(again)}"
    resolved = [e.turn_ref for e, _ in events if type(e).__name__ == "TurnResolved"]
    assert len(resolved) == len(set(resolved)) == len(turns)
    # Each fact cites its own turn's message (its provenance names the turn).
    by_summary = {e.record.summary: e.record for e, _ in rows}
    for rnd, _, t in turns:
        r = by_summary[facts[t.event_id]]
        assert (r.provenance.session, r.provenance.turn) == (t.session, rnd)

    # And the API lists each fact once.
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        async def listed():
            rows = (await op.list_memory(first=200))["records"]
            return rows if len(rows) >= len(facts) else None

        listing = await eventually(listed, timeout=60, interval=0.5)
    assert sorted(r["summary"] for r in listing) == sorted(facts.values())
    # Both workers really had partitions before the kill, and the dead one's were taken over.
    assert first_parts and second_parts and not set(first_parts) & set(second_parts)
    # The kill interrupted work: turns the dead worker was reviewing, never committed, were
    # reviewed again by the survivor (each once more, and their facts are still written once).
    twice = [f for f in facts.values() if len(fake.requests_with(marker_of(f))) > 1]
    assert twice, "no review was in flight at the kill"
    assert set(twice) <= set(in_flight), "only the dead worker's interrupted turns are reviewed again"
    print(f"facts at the kill: {done_at_kill}/{len(facts)}; turns reviewed twice: {len(twice)}; "
          f"partitions {first_parts} (killed) and {second_parts}")
