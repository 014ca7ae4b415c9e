"""Trust: the read-time breakdown, the usage counts the ledger folds without a new version,
and `expected_version` on every write. Pure: no broker, no store."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from events import AddMemory, DeleteMemory, EditMemory, PinMemory, ReportOutcome, UnpinMemory
from events.codec import encode
from events.commands import RecordUsage
from events.lean import decode_ledger_view
from events.record import MemoryRecord, Provenance, Scope, Source
from events.rules import trust
from events.rules.ledger import LedgerState, decide, evolve, get_record
from events.usage import Retrieved, RetrievedItem
from projections.records import MemoryFold
from workers.processors.ledger.snapshot_file import decode_state, encode_state

NOW = datetime(2026, 3, 1, tzinfo=UTC)
_ids = count()


def nid() -> str:
    return f"c{next(_ids)}"


def rec(**kw) -> MemoryRecord:
    base = dict(id="r1", version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope=Scope.AGENT,
                kind="fact", summary="The sky is blue")
    return MemoryRecord(**{**base, **kw})


# ---------------------------------------------------------------- the breakdown


def test_the_score_is_the_weighted_sum_of_the_inputs_and_the_weights_sum_to_one():
    b = trust.breakdown(rec(confidence=0.8, importance=0.9, usage_count=10, utility=0.75), NOW + timedelta(days=30))
    assert sum(trust.WEIGHTS.values()) == pytest.approx(1.0)
    inputs = b["inputs"]
    assert set(inputs) == {"confidence", "importance", "usage", "utility", "stability"}
    assert b["score"] == pytest.approx(sum(row["weight"] * row["value"] for row in inputs.values()), abs=1e-4)
    assert inputs["usage"]["value"] == pytest.approx(1 - 2.718281828 ** -1, abs=1e-4)  # 10 uses: 1 - 1/e
    assert inputs["stability"]["value"] == pytest.approx(0.5, abs=1e-4)  # one half-life, never confirmed
    assert (inputs["confidence"]["weight"], inputs["usage"]["usage_count"]) == (0.30, 10)


def test_more_usage_and_more_utility_raise_the_score():
    at = NOW + timedelta(days=3)
    score = [trust.breakdown(rec(usage_count=n), at)["score"] for n in (0, 1, 5, 50)]
    assert score == sorted(score) and len(set(score)) == 4
    util = [trust.breakdown(rec(utility=u), at)["score"] for u in (0.1, 0.5, 0.9)]
    assert util == sorted(util) and len(set(util)) == 3


def test_an_old_unconfirmed_fact_loses_stability_and_a_confirmed_one_keeps_more():
    values = [trust.breakdown(rec(), NOW + timedelta(days=d))["inputs"]["stability"]["value"] for d in (0, 30, 365)]
    assert values[0] == 1.0 and values[0] > values[1] > values[2] and values[2] < 0.001
    if "confirmations" in MemoryRecord.model_fields:  # the confirmation counter, when the record has one
        confirmed = trust.breakdown(rec(confirmations=3), NOW + timedelta(days=30))["inputs"]["stability"]["value"]
        assert confirmed > values[1]
    # A new version (an edit, a confirmation that bumps `modified`) starts the clock again.
    fresh = trust.breakdown(rec(modified=NOW + timedelta(days=360)), NOW + timedelta(days=365))
    assert fresh["inputs"]["stability"]["value"] > 0.8


@pytest.mark.parametrize("kw,days", [
    ({}, 0),
    ({"confidence": 1.0, "importance": 1.0, "usage_count": 10**9, "utility": 1.0}, 0),
    ({"confidence": 0.0, "importance": 0.0, "usage_count": 0, "utility": 0.0}, 10**4),
])
def test_every_value_and_the_score_stay_within_0_and_1(kw, days):
    b = trust.breakdown(rec(**kw), NOW + timedelta(days=days))
    assert 0.0 <= b["score"] <= 1.0
    assert all(0.0 <= row["value"] <= 1.0 for row in b["inputs"].values())


def test_unknown_confidence_counts_as_one_half():
    row = trust.breakdown(rec(), NOW)["inputs"]["confidence"]
    assert (row["value"], row["known"]) == (0.5, False)


# ---------------------------------------------------------------- the ledger


class Ledger:
    def __init__(self) -> None:
        self.state = LedgerState()

    def run(self, cmd):
        events = decide(self.state, cmd)
        for e in events:
            evolve(self.state, e)
        return events

    def add(self, summary="The sky is blue", **kw):
        return self.run(AddMemory(command_id=kw.pop("command_id", nid()), tenant="t", agent="a", issued_at=NOW,
                                  session="s1", summary=summary, **kw))

    def usage(self, counts, first=0, last=None, command_id=None, partition=0):
        last = first if last is None else last
        return self.run(RecordUsage(command_id=command_id or f"usage:{partition}:{first}-{last}", tenant="t",
                                    agent="a", issued_at=NOW, counts=counts, usage_partition=partition,
                                    from_offset=first, through_offset=last,
                                    provenance=Provenance(source=Source.OPERATOR, modified_by="trust")))

    def record(self, rid):
        return get_record(self.state, "t/a", rid)

    def frozen(self):
        s = self.state
        return copy.deepcopy((dict(s.records), dict(s.index), dict(s.stats), dict(s.usage_marks)))


def only(events, type_):
    assert [e.type for e in events] == [type_], [(e.type, getattr(e, "reason", "")) for e in events]
    return events[0]


def _cmd(cls, rid, **kw):
    return cls(command_id=nid(), tenant="t", agent="a", issued_at=NOW, record_id=rid, session="s1", **kw)


def _procedure(led: Ledger) -> str:
    e = led.run(AddMemory(command_id=nid(), tenant="t", agent="a", issued_at=NOW, session="s1", kind="procedure",
                          summary="Deploy with make ship", provenance=Provenance(source=Source.CONSOLIDATION)))
    return only(e, "RecordAdded").record.id


@pytest.mark.parametrize("make", [
    lambda rid: _cmd(DeleteMemory, rid, expected_version=1),
    lambda rid: _cmd(UnpinMemory, rid, expected_version=1),
    lambda rid: _cmd(PinMemory, rid, expected_version=1),
    lambda rid: AddMemory(command_id=nid(), tenant="t", agent="a", issued_at=NOW, session="s1",
                          summary="The sky is grey", replaces=rid, expected_version=1),
    lambda rid: EditMemory(command_id=nid(), tenant="t", agent="a", issued_at=NOW, record_id=rid, expected_version=1,
                           summary="The sky is grey", provenance=Provenance(source=Source.OPERATOR)),
], ids=["delete", "unpin", "pin", "replace", "edit"])
def test_a_stale_expected_version_is_refused_naming_the_current_version_and_changes_nothing(make):
    led = Ledger()
    rid = only(led.add(), "RecordAdded").record.id
    led.usage({rid: 3})  # usage makes no version: version 1 is still current
    assert led.record(rid).version == 1
    # The record moves on to version 2 under the writer's feet (a tombstone is a version too).
    only(led.run(_cmd(DeleteMemory, rid)), "RecordDeleted")
    assert led.record(rid).version == 2
    before = led.frozen()
    e = only(led.run(make(rid)), "CommandRejected")
    assert (e.code, e.field) == ("VERSION_CONFLICT", "expected_version")
    assert e.reason == "expected version 1 but the record is at version 2; read it again and retry"
    assert led.frozen() == before


def test_a_current_expected_version_is_applied():
    led = Ledger()
    rid = only(led.add(), "RecordAdded").record.id
    events = led.add("The sky is grey", replaces=rid, expected_version=1)
    assert [e.type for e in events] == ["RecordSuperseded", "RecordAdded"]
    only(led.run(_cmd(DeleteMemory, events[1].record.id, expected_version=1)), "RecordDeleted")


def test_a_report_outcome_checks_the_version_and_learns_utility():
    led = Ledger()
    rid = _procedure(led)
    before = led.frozen()
    e = only(led.run(_cmd(ReportOutcome, rid, success=True, expected_version=2)), "CommandRejected")
    assert (e.code, "at version 1" in e.reason) == ("VERSION_CONFLICT", True)
    assert led.frozen() == before
    r = only(led.run(_cmd(ReportOutcome, rid, success=True, expected_version=1)), "RecordRevised").record
    assert (r.version, r.utility) == (2, pytest.approx(2 / 3))
    r = only(led.run(_cmd(ReportOutcome, rid, success=False)), "RecordRevised").record
    assert r.utility == pytest.approx(0.5)


def test_expected_version_0_means_must_create():
    led = Ledger()
    first = only(led.add(expected_version=0), "RecordAdded").record
    assert first.version == 1
    before = led.frozen()
    e = only(led.add(expected_version=0), "CommandRejected")  # the same fact again would merge
    assert (e.code, e.field) == ("VERSION_CONFLICT", "expected_version")
    assert f"record {first.id} states the same and is at version 1" in e.reason
    e = only(led.add("Another fact", expected_version=2), "CommandRejected")
    assert (e.code, e.field) == ("VALIDATION_FAILED", "expected_version")
    assert led.frozen() == before
    assert only(led.add(), "RecordAdded").merged  # without expected_version a restatement still merges


def test_importance_is_set_on_write_and_defaults_to_one_half():
    led = Ledger()
    assert only(led.add(), "RecordAdded").record.importance == 0.5
    assert only(led.add("Important", importance=0.9), "RecordAdded").record.importance == 0.9


def test_record_usage_adds_counts_without_a_new_version():
    led = Ledger()
    a = only(led.add(), "RecordAdded").record.id
    b = only(led.add("Another fact"), "RecordAdded").record.id
    e = only(led.usage({a: 2, b: 1, "unknown": 5}, first=10, last=12), "UsageRecorded")
    assert e.totals == {a: 2, b: 1}
    only(led.usage({a: 1}, first=13), "UsageRecorded")
    assert (led.record(a).usage_count, led.record(a).version) == (3, 1)
    assert (led.record(b).usage_count, led.record(b).version) == (1, 1)
    # The next real version carries the count along.
    r = only(led.run(_cmd(DeleteMemory, a, expected_version=1)), "RecordDeleted").record
    assert (r.version, r.usage_count) == (2, 3)


def test_the_same_usage_span_counts_once_whatever_its_command_id():
    led = Ledger()
    a = only(led.add(), "RecordAdded").record.id
    cmd_events = led.usage({a: 2}, first=5, last=7)
    assert only(cmd_events, "UsageRecorded").totals == {a: 2}
    assert led.usage({a: 2}, first=5, last=7) == []  # the same command again
    assert led.usage({a: 2}, first=6, last=9, command_id="other") == []  # a span that overlaps a counted one
    assert led.record(a).usage_count == 2
    assert only(led.usage({a: 1}, first=5, partition=1), "UsageRecorded").totals == {a: 3}  # another partition


def test_usage_comes_back_from_the_log_and_from_a_snapshot():
    led = Ledger()
    events = led.add()
    rid = events[0].record.id
    events += led.usage({rid: 4}, first=3, last=4)
    # A recovery folds the ledger's own events as `LedgerView`s.
    recovered = LedgerState()
    for e in events:
        evolve(recovered, decode_ledger_view(encode(e)))
    assert (get_record(recovered, "t/a", rid).usage_count, dict(recovered.usage_marks)) == (4, {"t/a|0": 4})
    again = RecordUsage(command_id="again", tenant="t", agent="a", issued_at=NOW, counts={rid: 4},
                        usage_partition=0, from_offset=3, through_offset=4)
    assert decide(recovered, again) == []
    state, _, _ = decode_state(encode_state(led.state, {}))
    assert (get_record(state, "t/a", rid).usage_count, dict(state.usage_marks)) == (4, {"t/a|0": 4})
    assert decide(state, again) == []


async def test_the_projection_fold_shows_the_usage_count_at_the_same_version():
    led = Ledger()
    events = led.add()
    rid = events[0].record.id
    events += led.usage({rid: 2}, first=1) + led.usage({rid: 1}, first=2)
    fold = MemoryFold()
    await fold.apply(events)
    r = await fold.get("t", "a", rid)
    assert (r.version, r.usage_count) == (1, 3)
    assert (await fold.get("t", "a", rid, version=1)).usage_count == 0  # the version as written
    assert [x.usage_count for x in (await fold.page("t", "a", 10)).records] == [3]


# ---------------------------------------------------------------- the worker's fold


def _retrieved(ids, tool="search_memory", agent="a", at=NOW):
    return Retrieved(usage_id=nid(), tenant="t", agent=agent, occurred_at=at, tool=tool,
                     items=[RetrievedItem(id=i, version=1) for i in ids])


def test_the_worker_sends_one_command_per_agent_named_after_its_offsets():
    spans: dict = {}
    trust.fold_usage(spans, 2, 10, _retrieved(["r1", "r2"]))
    trust.fold_usage(spans, 2, 11, _retrieved(["h1"], tool="search_history"))
    trust.fold_usage(spans, 2, 12, _retrieved(["r1"], agent="b"))
    trust.fold_usage(spans, 2, 13, _retrieved(["r1"], tool="recall", at=NOW + timedelta(seconds=1)))
    cmds = sorted(trust.usage_commands(spans), key=lambda c: c.agent)
    assert [(c.agent, c.command_id, c.counts, c.from_offset, c.through_offset) for c in cmds] == [
        ("a", "usage:2:10-13", {"r1": 2, "r2": 1}, 10, 13),
        ("b", "usage:2:12-12", {"r1": 1}, 12, 12),
    ]
    assert cmds[0].issued_at == NOW + timedelta(seconds=1)
    again: dict = {}
    for off, ev in ((10, _retrieved(["r1", "r2"])),):
        trust.fold_usage(again, 2, off, ev)
    assert trust.usage_commands(again)[0].command_id == "usage:2:10-10"
