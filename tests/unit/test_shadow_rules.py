"""Shadow replay's pure rules: decisions read from the events a policy made, the memories a shadow
review is shown, and each policy's precision and recall against the facts a turn should keep."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.memory import RecordAdded, RecordDeleted, RecordSuperseded
from events.record import MemoryRecord, Scope, Status
from events.rules import shadow

T = datetime(2026, 3, 1, tzinfo=UTC)


def rec(rid: str, summary: str, status: Status = Status.ACTIVE, age_s: int = 0) -> MemoryRecord:
    at = T - timedelta(seconds=age_s)
    return MemoryRecord(id=rid, version=1, created=at, modified=at, tenant="t", agent="a", scope="AGENT",
                        kind="fact", summary=summary, status=status)


def test_decisions_are_what_the_record_events_did_and_a_restatement_adds_nothing():
    base = dict(event_id="e", command_id="c", tenant="t", agent="a", occurred_at=T)
    events = [RecordAdded(**base, record=rec("r1", "likes tea")),
              RecordAdded(**base, record=rec("r2", "lives in Porto"), merged=True),
              RecordSuperseded(**base, record=rec("r3", "works at Acme", Status.SUPERSEDED)),
              RecordDeleted(**base, record=rec("r4", "has a cat", Status.DELETED))]
    got = shadow.decisions_of(events)
    assert got.as_json() == {"added": ["likes tea"], "replaced": ["works at Acme"], "deleted": ["has a cat"]}
    assert shadow.differs(got, shadow.Decisions(added=["likes tea"]))
    theirs = rec("r5", "Fay's locker code is 4411").model_copy(update={"scope": Scope.USER, "user": "fay"})
    made_from_her_turn = rec("r6", "Fay's team ships on Fridays").model_copy(update={"user": "fay"})  # agent scope
    assert shadow.decisions_of([RecordAdded(**base, record=r) for r in (theirs, made_from_her_turn)]).added == [
        "(a record of member fay)", "(a record of member fay)"]
    assert not shadow.differs(got, shadow.decisions_of(events))


def test_a_review_is_shown_the_live_memories_sharing_most_words_newest_first_on_ties():
    records = [rec("old", "Dana likes green tea", age_s=60), rec("new", "Dana likes coffee", age_s=1),
               rec("gone", "Dana likes green tea a lot", Status.DELETED), rec("other", "the office is in Porto")]
    shown = shadow.similar(records, ["what does Dana like to drink, tea?"], limit=2)
    assert [r.id for r in shown] == ["old", "new"]
    assert shadow.similar(records, []) == []


def test_each_policy_is_scored_by_the_facts_it_kept_against_those_expected():
    expected = {"s1/1": ["Likes green tea."], "s1/2": ["Lives in Porto", "Works at Acme"]}
    live = {"s1/1": ["likes green tea"], "s1/2": ["lives in Lisbon"], "s1/3": ["not scored"]}
    assert shadow.score(live, expected) == {"kept": 2, "expected": 3, "matched": 1, "precision": 0.5,
                                            "recall": 0.333}
    assert shadow.score({}, expected)["precision"] is None
