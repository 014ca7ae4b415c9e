"""Retention over simulated time: expired live facts and superseded rows older than
the retention period become tombstones; tombstones deleted at least 180 days ago are purged,
newer ones stay readable; each night is capped per subject. Pure: no broker, no store."""

from datetime import timedelta

from events import DeleteMemory
from events.record import Status
from events.rules.ledger import get_record
from events.rules.ledger.retention import RETENTION, due
from tests.unit.test_ledger_rules import NOW, Ledger, nid, only


def _night(ledger: Ledger, now, cap=500):
    night = due(ledger.state, now, cap=cap)
    events = [e for cmd in night.commands for e in ledger.run(cmd)]
    return night, events


def _delete(ledger: Ledger, rid, at):
    return ledger.run(DeleteMemory(command_id=nid(), tenant="t", agent="a", issued_at=at, record_id=rid, session="s1"))


def test_tombstones_older_than_the_retention_period_are_purged_and_newer_ones_stay():
    led = Ledger()
    old = only(led.add("Old fact"), "RecordAdded").record.id
    new = only(led.add("New fact"), "RecordAdded").record.id
    _delete(led, old, NOW)
    _delete(led, new, NOW + timedelta(days=100))
    night, events = _night(led, NOW + RETENTION + timedelta(days=1))
    assert [e.type for e in events] == ["RecordsPurged"] and events[0].record_ids == [old]
    assert (night.purged, night.deferred) == (1, 0)
    assert get_record(led.state, "t/a", old) is None  # unrecoverable from the ledger's state
    kept = get_record(led.state, "t/a", new)
    assert kept.status is Status.DELETED and kept.summary == "New fact"  # its version history stays
    # The next night purges the second once it is old enough, and never the first again.
    _, events = _night(led, NOW + timedelta(days=100) + RETENTION)
    assert [(e.type, e.record_ids) for e in events] == [("RecordsPurged", [new])]


def test_expired_live_facts_are_tombstoned_then_purged_a_retention_period_later():
    led = Ledger()
    rid = only(led.add("Short lived", expires_at=NOW + timedelta(days=1)), "RecordAdded").record.id
    night, events = _night(led, NOW + timedelta(days=2))
    assert night.expired == 1 and [e.type for e in events] == ["RecordExpired"]
    assert get_record(led.state, "t/a", rid).status is Status.DELETED
    _, events = _night(led, NOW + timedelta(days=2) + RETENTION)
    assert [(e.type, e.record_ids) for e in events] == [("RecordsPurged", [rid])]


def test_superseded_rows_past_the_period_become_tombstones():
    led = Ledger()
    rid = only(led.add("Version one"), "RecordAdded").record.id
    led.add("Version two", replaces=rid)
    assert get_record(led.state, "t/a", rid).status is Status.SUPERSEDED
    _, events = _night(led, NOW + timedelta(days=10))
    assert events == []
    night, events = _night(led, NOW + RETENTION + timedelta(days=1))
    # The successor is the agent's own memory, durable: it stays live.
    assert (night.superseded, night.expired) == (1, 0)
    assert [e.type for e in events] == ["RecordDeleted"]
    assert get_record(led.state, "t/a", rid).status is Status.DELETED


def test_each_night_is_capped_per_subject_and_the_rest_waits():
    led = Ledger()
    ids = [only(led.add(f"Fact number {i}"), "RecordAdded").record.id for i in range(7)]
    for rid in ids:
        _delete(led, rid, NOW)
    later = NOW + RETENTION + timedelta(days=1)
    night, events = _night(led, later, cap=3)
    assert (night.purged, night.deferred) == (3, 4)
    assert sum(len(e.record_ids) for e in events) == 3
    night, _ = _night(led, later + timedelta(days=1), cap=3)
    assert (night.purged, night.deferred) == (3, 1)
    night, _ = _night(led, later + timedelta(days=2), cap=3)
    assert (night.purged, night.deferred) == (1, 0)
    assert all(get_record(led.state, "t/a", rid) is None for rid in ids)


def test_a_purge_command_checks_every_id_itself():
    """A purge named early (a replayed or forged command) purges nothing that is not due."""
    from events.commands import PurgeRecords

    led = Ledger()
    rid = only(led.add("Still live"), "RecordAdded").record.id
    gone = only(led.add("Deleted today"), "RecordAdded").record.id
    _delete(led, gone, NOW)
    events = led.run(PurgeRecords(command_id=nid(), tenant="t", agent="a", issued_at=NOW + timedelta(days=1),
                                  record_ids=[rid, gone, "unknown"]))
    assert events == []
    assert get_record(led.state, "t/a", rid).status is Status.ACTIVE and get_record(led.state, "t/a", gone)
