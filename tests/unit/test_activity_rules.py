"""The activity rule (events.rules.activity): what each message counts, and by which id it
counts once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events import codec
from events.memory import ConsentGranted, RecordAdded, RecordDeleted, RecordPinned, RecordSuperseded
from events.record import MemoryRecord, Provenance, Scope, Source
from events.rules.activity import KEEP_MINUTES, counted, fresh, minute_of, worth_decoding
from events.topics import EVENTS, TURNS, USAGE
from events.turns import SessionEnded, TurnCommitted, TurnRolledBack
from events.usage import CandidateRefused, ModelUsage, Retrieved, RetrievedItem

AT = datetime(2026, 3, 1, 12, 30, 15, tzinfo=UTC)


def turn(tenant="t1", agent="a1", n=1, attempt=1, at=AT, rolled_back=False, execution="x1"):
    kind = TurnRolledBack if rolled_back else TurnCommitted
    return kind(event_id=f"e{n}.{attempt}.{int(rolled_back)}", tenant=tenant, agent=agent, session="s1", turn=n,
                attempt=attempt, execution_id=execution, occurred_at=at)


def record_event(cls=RecordAdded, tenant="t1", agent="a1", rid="r1", command="c1", source=Source.EXTRACTION,
                 at=AT, event_id=None):
    rec = MemoryRecord(id=rid, version=1, created=at, modified=at, tenant=tenant, agent=agent, scope=Scope.AGENT,
                       kind="fact", summary="The customer prefers email")
    return cls(event_id=event_id or f"ev-{rid}-{cls.__name__}", command_id=command, tenant=tenant, agent=agent,
               occurred_at=at, provenance=Provenance(source=source), record=rec)


def retrieved(usage_id="u1", tenant="t1", agent="a1", ids=("r1",), recall=True, at=AT):
    return Retrieved(usage_id=usage_id, tenant=tenant, agent=agent, occurred_at=at, tool="recall" if recall else
                     "search_memory", recall=recall, items=[RetrievedItem(id=i, version=1) for i in ids])


def refused(usage_id="u9", tenant="t1", agent="a1", at=AT):
    return CandidateRefused(usage_id=usage_id, tenant=tenant, agent=agent, occurred_at=at, reason="too vague",
                            summary_preview="something")


def test_a_committed_or_rolled_back_turn_counts_once_by_its_attempt():
    committed, rolled = counted(turn()), counted(turn(rolled_back=True))
    assert [(t.kind, t.what, t.minute) for t in committed.ticks] == [("turns", "committed", minute_of(AT))]
    assert [(t.kind, t.what) for t in rolled.ticks] == [("turns", "rolled_back")]
    # The same attempt is the same member, whichever way it ended; a retry is another.
    assert committed.ticks[0].member == rolled.ticks[0].member == "t1/a1/t:x1:1:1"
    assert counted(turn(attempt=2)).ticks[0].member == "t1/a1/t:x1:1:2"
    assert counted(turn(agent="a2")).ticks[0].member != committed.ticks[0].member
    assert counted(SessionEnded(event_id="se", tenant="t1", agent="a1", occurred_at=AT)).ticks == ()


def test_extraction_decisions_count_once_per_command():
    added = counted(record_event(RecordAdded))
    assert [(t.kind, t.what) for t in added.ticks] == [("decisions", "added")]
    # A replace writes RecordSuperseded and RecordAdded for one command: one member.
    sup = counted(record_event(RecordSuperseded, rid="r0"))
    assert sup.ticks[0].what == "superseded" and sup.ticks[0].member == added.ticks[0].member == "t1/a1/c:c1"
    assert counted(record_event(RecordDeleted, command="c2")).ticks[0].what == "deleted"
    assert counted(refused()).ticks[0].what == "refused"
    assert counted(refused()).ticks[0].kind == "decisions"


def test_what_is_not_an_extraction_decision_counts_nothing():
    assert counted(record_event(source=Source.TOOL)).ticks == ()
    assert counted(record_event(source=Source.OPERATOR)).ticks == ()
    assert counted(record_event(RecordPinned)).ticks == ()
    assert counted(ConsentGranted(event_id="e", command_id="c", tenant="t1", agent="a1", occurred_at=AT,
                                  user="u")).ticks == ()
    assert counted(ModelUsage(usage_id="m", tenant="t1", agent="a1", occurred_at=AT, purpose="memory",
                              model="m")).ticks == ()
    # The ledger's copy of a redelivered command's event: its original counted.
    assert counted(record_event(), redelivered=True).ticks == ()


def test_a_recall_counts_and_names_each_record_once():
    got = counted(retrieved(ids=("r1", "r2", "r1")))
    assert [(t.kind, t.member) for t in got.ticks] == [("recalls", "t1/a1/u:u1")]
    assert got.recalled.record_ids == ("r1", "r2")
    assert got.recalled.usage_id == "u1" and got.recalled.at_ms == int(AT.timestamp() * 1000)
    search = counted(retrieved(recall=False))
    assert search.ticks == () and search.recalled is None


def test_minutes_are_kept_for_two_hours():
    now = minute_of(AT)
    assert minute_of(AT) == minute_of(AT.replace(second=0)) == minute_of(AT + timedelta(seconds=44))
    assert minute_of(AT + timedelta(minutes=1)) == now + 1
    assert fresh(now, now) and fresh(now - KEEP_MINUTES + 1, now)
    assert not fresh(now - KEEP_MINUTES, now)


def test_only_messages_that_may_count_are_decoded():
    raw = lambda m: codec.encode(m)  # noqa: E731 (no cipher in unit tests: plaintext)
    assert worth_decoding(TURNS.name, raw(turn()))
    assert not worth_decoding(TURNS.name, raw(SessionEnded(event_id="se", tenant="t1", agent="a1", occurred_at=AT)))
    assert worth_decoding(EVENTS.name, raw(record_event()))
    assert not worth_decoding(EVENTS.name, raw(record_event(source=Source.TOOL)))
    assert not worth_decoding(EVENTS.name, raw(record_event(RecordPinned)))
    assert worth_decoding(USAGE.name, raw(retrieved())) and worth_decoding(USAGE.name, raw(refused()))
    assert not worth_decoding(USAGE.name, raw(ModelUsage(usage_id="m", tenant="t1", agent="a1", occurred_at=AT,
                                                         purpose="embed", model="m")))
    # Not JSON: decoded, so the codec says why it is poison; an empty value is a tombstone.
    assert worth_decoding(USAGE.name, b"\x00garbage") and not worth_decoding(USAGE.name, b"")
