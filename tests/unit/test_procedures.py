"""Procedures across runs: confirmations, promotion by the ledger, ranking by outcomes; and
the link from a run's extraction-made facts to its episode. Pure: decide/evolve, no broker."""

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from events import AddMemory, AgentConfig, ConfigureAgent, DeleteMemory, ReportOutcome, encode
from events.lean import decode_ledger_view
from events.record import MemoryRecord, Provenance, Source
from events.rules import procedures as p
from events.rules.ledger import LedgerState, decide, evolve, get_record, record_id_for

NOW = datetime(2026, 3, 1, tzinfo=UTC)
_ids = count()
MEMORY = {"kinds": ["fact", "decision", "approved_pattern"],
          "scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}


def nid() -> str:
    return f"p{next(_ids)}"


class Ledger:
    def __init__(self):
        self.state, self.log = LedgerState(), []
        self.run(ConfigureAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW,
                                config=AgentConfig.model_validate({"memory": MEMORY})))

    def run(self, cmd):
        events = decide(self.state, cmd)
        for e in events:
            evolve(self.state, e)
        self.log += events
        return events

    def add(self, summary, session, kind="decision", confidence=0.9, source=Source.TOOL, execution=None, **kw):
        prov = Provenance(source=source, session=session, execution_id=execution)
        return self.run(AddMemory(command_id=kw.pop("command_id", nid()), tenant="t", agent="a",
                                  issued_at=kw.pop("issued_at", NOW + timedelta(minutes=next(_ids))),
                                  summary=summary, kind=kind, scope=kw.pop("scope", "AGENT"), session=session,
                                  confidence=confidence, provenance=prov, **kw))

    def report(self, rid, success):
        return self.run(ReportOutcome(command_id=nid(), tenant="t", agent="a", issued_at=NOW, record_id=rid,
                                      success=success, session="s9"))

    def record(self, rid) -> MemoryRecord:
        return get_record(self.state, "t/a", rid)


def rec(rid="r", **kw) -> MemoryRecord:
    base = dict(id=rid, version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope="AGENT", kind="decision",
                summary=f"use {rid}", confidence=0.9, provenance=Provenance(session="s1"))
    return MemoryRecord(**(base | kw))


# --- confirm, promotes: pure ---

def test_a_restatement_from_another_run_confirms_and_one_from_the_same_run_does_not():
    r = rec(confidence=0.7)
    assert p.confirm(r, Provenance(session="s1"), "s1", 0.9, NOW) is None  # a repeat within the run
    assert p.confirm(r, Provenance(), None, 0.9, NOW) is None  # a write that names no run
    assert p.confirm(rec(provenance=Provenance(session="s1", execution_id="x1")),
                     Provenance(session="s1", execution_id="x1"), "s1", 0.9, NOW) is None
    c = p.confirm(r, Provenance(session="s2"), "s2", 0.95, NOW + timedelta(days=1))
    assert (c.version, c.confirmations, c.confidence, c.provenance.session) == (2, 1, 0.95, "s2")
    assert (c.summary, c.modified) == (r.summary, NOW + timedelta(days=1))
    assert p.confirm(c, Provenance(session="s3"), "s3", None, NOW).confidence == 0.95  # never lowered
    # Another execution in the same session is another run; the episode a fact names stays.
    linked = rec(provenance=Provenance(session="s1", execution_id="x1", episode="ep"))
    c = p.confirm(linked, Provenance(session="s1", execution_id="x2"), "s1", None, NOW)
    assert (c.confirmations, c.provenance.episode, c.provenance.execution_id) == (1, "ep", "x2")


@pytest.mark.parametrize(("kind", "confirmations", "confidence", "promotes"), [
    ("decision", 2, 0.8, True),
    ("approved_pattern", 2, 0.95, True),
    ("decision", 1, 0.99, False),  # stated in two runs only
    ("decision", 5, 0.79, False),  # not confident enough
    ("decision", 5, None, False),
    ("fact", 5, 0.99, False),  # not a kind that becomes a procedure
])
def test_an_approved_pattern_or_decision_stated_in_three_runs_with_confidence_promotes(kind, confirmations,
                                                                                        confidence, promotes):
    assert p.promotes(rec(kind=kind, confirmations=confirmations, confidence=confidence)) is promotes


# --- the ledger: confirmations and promotion ---

def test_the_third_run_that_states_a_decision_makes_one_procedure():
    led = Ledger()
    [first] = led.add("Deploys go out on Tuesdays", "s1")
    fact = first.record
    assert fact.confirmations == 0
    again = led.add("deploys go out on tuesdays.", "s1")  # the same run: merged, not counted
    assert [(e.type, e.merged, e.record.version) for e in again] == [("RecordAdded", True, 1)]
    second = led.add("Deploys go out on Tuesdays", "s2")
    assert [(e.type, e.record.id, e.record.version, e.record.confirmations) for e in second] == [
        ("RecordAdded", fact.id, 2, 1)]
    third = led.add("Deploys go out on Tuesdays", "s3", confidence=0.8)
    assert [(e.type, e.record.kind) for e in third] == [("RecordAdded", "decision"), ("RecordAdded", "procedure")]
    assert third[0].merged and third[0].record.confirmations == 2
    proc = third[1].record
    assert proc.id == p.procedure_id(fact) and (proc.summary, proc.scope, proc.version) == (fact.summary, fact.scope, 1)
    assert proc.provenance.source is Source.CONSOLIDATION
    assert proc.metadata == {"from_facts": [fact.id], "validations": 0, "successes": 0, "failures": 0,
                             "anti_pattern": False, "confirmations": 2}
    # Once: a fourth run counts on the fact and makes no second procedure.
    fourth = led.add("Deploys go out on Tuesdays", "s4")
    assert [(e.type, e.record.kind, e.record.confirmations) for e in fourth] == [("RecordAdded", "decision", 3)]
    # The procedure takes outcomes like any.
    assert led.report(proc.id, True)[0].record.metadata["successes"] == 1


@pytest.mark.parametrize(("kind", "confidence"), [("fact", 0.99), ("decision", 0.6)])
def test_other_kinds_and_low_confidence_never_promote(kind, confidence):
    led = Ledger()
    for s in ("s1", "s2", "s3", "s4", "s5"):
        events = led.add("Staging restores use the nightly backup", s, kind=kind, confidence=confidence)
        assert [e.record.kind for e in events] == [kind]
    [fact] = [r for r in map(MemoryRecord.model_validate_json, led.state.records.values()) if r.kind == kind]
    assert fact.confirmations == 4


def test_a_confident_confirmation_promotes_a_fact_confirmed_before_with_less_confidence():
    led = Ledger()
    led.add("Use blue-green deploys", "s1", kind="approved_pattern", confidence=0.5)
    led.add("Use blue-green deploys", "s2", kind="approved_pattern", confidence=0.6)
    events = led.add("Use blue-green deploys", "s3", kind="approved_pattern", confidence=0.9)
    assert [e.record.kind for e in events] == ["approved_pattern", "procedure"]


def test_a_replay_of_the_log_and_its_lean_view_fold_to_the_same_state():
    led = Ledger()
    for s in ("s1", "s2", "s3"):
        led.add("Deploys go out on Tuesdays", s)
    led.add("The build cache is S3", "s1", kind="fact", source=Source.EXTRACTION, execution="x1")
    led.add("Run 1 went well", "s1", kind="episode", source=Source.CONSOLIDATION, execution="x1")
    led.add("Run 2's fact", "s2", kind="fact", source=Source.EXTRACTION, execution="x2")
    full, lean = LedgerState(), LedgerState()
    for e in led.log:
        evolve(full, e)
        evolve(lean, decode_ledger_view(encode(e)))  # as the ledger recovers
    assert sorted(k for k in led.state.index if "|run:" in k) == ["t/a|run:s:s2", "t/a|run:x:x2"]  # run 2 is open
    for replayed in (full, lean):
        for name in ("records", "index", "stats"):
            assert dict(getattr(replayed, name)) == dict(getattr(led.state, name)), name


# --- the ledger: a run's extraction-made facts name its episode ---

def test_an_episode_links_the_live_extraction_made_facts_of_its_run_once():
    led = Ledger()
    [a] = led.add("The build cache lives in S3", "s1", kind="fact", source=Source.EXTRACTION, execution="x1",
                  scope="SESSION")
    [b] = led.add("CI runs on arm64", None, kind="fact", source=Source.EXTRACTION, execution="x1")
    [gone] = led.add("A fact deleted later", "s1", kind="fact", source=Source.EXTRACTION, scope="SESSION")
    led.add("A tool write of the run", "s1", kind="fact", source=Source.TOOL, scope="SESSION")
    led.add("Another session's fact", "s2", kind="fact", source=Source.EXTRACTION, scope="SESSION")
    led.run(DeleteMemory(command_id=nid(), tenant="t", agent="a", issued_at=NOW, record_id=gone.record.id,
                         session="s1"))
    events = led.add("Restored staging", "s1", kind="episode", source=Source.CONSOLIDATION, execution="x1",
                     command_id="ep1")
    episode_id = record_id_for("t", "a", "ep1")
    assert [(e.type, e.record.id) for e in events] == [
        ("RecordAdded", episode_id), ("EpisodeLinked", a.record.id), ("EpisodeLinked", b.record.id)]
    for e, made in zip(events[1:], (a, b)):
        linked = e.record
        assert (e.episode, linked.provenance.episode, linked.version) == (episode_id, episode_id, 2)
        assert linked.provenance.source is Source.EXTRACTION  # the write's own provenance, now naming the episode
        assert linked.model_dump(exclude={"version", "modified", "provenance"}) == made.record.model_dump(
            exclude={"version", "modified", "provenance"})
        assert led.record(made.record.id) == linked
    # A second episode of the run links nothing again; a later fact of the run waits for the next.
    assert [e.type for e in led.add("Resumed", "s1", kind="episode", source=Source.CONSOLIDATION,
                                    execution="x1")] == ["RecordAdded"]
    [late] = led.add("Late fact", "s1", kind="fact", source=Source.EXTRACTION, scope="SESSION")
    last = led.add("Ended again", "s1", kind="episode", source=Source.CONSOLIDATION)
    assert [(e.type, e.record.id) for e in last][1:] == [("EpisodeLinked", late.record.id)]
    replayed = LedgerState()
    for e in led.log:
        evolve(replayed, decode_ledger_view(encode(e)))
    assert dict(replayed.records) == dict(led.state.records) and dict(replayed.index) == dict(led.state.index)


def test_a_fact_linked_to_its_episode_keeps_it_when_confirmed():
    led = Ledger()
    [a] = led.add("Use the nightly backup", "s1", kind="decision", source=Source.EXTRACTION, execution="x1")
    led.add("Run", "s1", kind="episode", source=Source.CONSOLIDATION, execution="x1", command_id="ep2")
    [c] = led.add("Use the nightly backup", "s2")
    assert (c.record.version, c.record.confirmations) == (3, 1)
    assert c.record.provenance.episode == record_id_for("t", "a", "ep2")


# --- rank: outcomes order procedures ---

def proc(rid, successes=0, failures=0, anti=False) -> MemoryRecord:
    return rec(rid, kind="procedure", metadata={"successes": successes, "failures": failures,
                                                "validations": successes + failures, "anti_pattern": anti})


def test_with_equal_relevance_successes_outrank_failures_and_anti_patterns_come_last():
    won, lost, avoid = proc("a", failures=5), proc("b", successes=5), proc("c", anti=True)
    assert p.success_rate(won) == pytest.approx(1 / 7) and p.success_rate(lost) == pytest.approx(6 / 7)
    ranked = p.rank([avoid, won, lost], {"a": 0.5, "b": 0.5, "c": 0.9})
    assert [r.id for r in ranked] == ["b", "a", "c"]
    # Outcomes outweigh a small difference in relevance; relevance still counts: an unrelated
    # procedure with good outcomes stays below.
    assert [r.id for r in p.rank([won, lost], {"a": 0.55, "b": 0.5})] == ["b", "a"]
    assert [r.id for r in p.rank([proc("x", successes=9), proc("y")], {"x": 0.1, "y": 0.6})] == ["y", "x"]
    assert [r.id for r in p.rank([proc("n"), proc("m")], {})] == ["m", "n"]  # ties: by id


def test_reported_outcomes_flip_the_order():
    led = Ledger()
    ids = []
    for summary in ("Restore from the nightly backup", "Restore from the replica"):
        for s in ("s1", "s2", "s3"):
            events = led.add(summary, s)
        ids.append(events[-1].record.id)
    first, second = ids
    before = p.rank([led.record(first), led.record(second)], {first: 0.7, second: 0.7})
    for _ in range(3):
        led.report(before[0].id, False)
        led.report(before[1].id, True)
    after = p.rank([led.record(first), led.record(second)], {first: 0.7, second: 0.7})
    assert [r.id for r in after] == [before[1].id, before[0].id]
