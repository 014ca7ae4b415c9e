"""The reconciler's pure rules: what differs between the record view and the index, and
when the two can be compared at all."""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime

from events.lean import LeanRecord
from events.record import Scope, Status
from workers.followers.qdrant_projection import PARKED, READ, safe_checkpoint
from workers.followers.reconciler import gaps, settled

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def lean(rid: str, status: Status = Status.ACTIVE, version: int = 1) -> LeanRecord:
    return LeanRecord(id=rid, version=version, created=T0, tenant="t", agent="a", scope=Scope.AGENT, kind="fact",
                      summary=rid, status=status)


def test_gaps_are_active_records_without_points_and_points_of_unindexable_records():
    view = {"a": lean("a"), "b": lean("b"), "c": lean("c", Status.DELETED, 2), "d": lean("d", Status.PENDING)}
    found = gaps(view, {"a", "c", "unknown"})
    assert [r.id for r in found.missing] == ["b"]
    assert found.stale == [("c", 2)]  # a point the view does not know stays


def test_views_compare_only_once_the_index_has_what_the_view_reflects():
    assert settled(landed=10, view_at=10, started=0)
    assert not settled(landed=9, view_at=10, started=0)  # the projection lags the view
    assert not settled(landed=12, view_at=4, started=5)  # the view lags what the index held at start


def test_the_checkpoint_stops_at_the_first_parked_event_and_held_vector():
    ev, vec = "events:0", "vectors:0"
    out = safe_checkpoint({ev: 10, vec: 7}, {ev: OrderedDict.fromkeys([3, 8])}, {vec: OrderedDict.fromkeys([5])}, {})
    assert out == {ev: 3, vec: 5, PARKED: {ev: [3, 8]}, READ: {ev: 10}}
    assert safe_checkpoint({ev: 10}, {ev: OrderedDict()}, {}, {}) == {ev: 10}


def test_a_range_being_redone_carries_over_what_it_has_not_reached():
    ev = "events:0"
    # Restarted at 3 to redo 3 and 8 of a range read to 10; 3 is parked again, 8 not reached.
    assert safe_checkpoint({ev: 5}, {ev: OrderedDict.fromkeys([3])}, {}, {ev: (10, {8})}) == {
        ev: 3, PARKED: {ev: [3, 8]}, READ: {ev: 10}}
    # Nothing left to redo: resume past the range, whose other events are in the index.
    assert safe_checkpoint({ev: 5}, {}, {}, {ev: (10, set())}) == {ev: 10}
