"""The pure due-rules of memlane's scheduled jobs (docs/operations/scheduled-jobs.md): when the ledger's
expiry sweep is due and what it names, and when a memory shard's index wants optimising.
No broker, no store, no clock."""

from datetime import timedelta

from events import DeleteMemory
from events.record import Status
from events.rules.ledger import get_record
from events.rules.ledger.sweep import MODIFIED_BY, due, is_due, next_sweep
from tests.unit.test_ledger_rules import NOW, Ledger, nid, only
from workers.jobs.optimize_policy import optimize_due, unindexed_points


def _sweep(ledger: Ledger, now, asked=frozenset(), batch=500):
    sweep = due(ledger.state, now, asked, batch=batch)
    events = [e for cmd in sweep.commands for e in ledger.run(cmd)]
    return sweep, events


def test_the_schedule_is_every_interval_and_off_at_zero():
    assert next_sweep(NOW, 60) == NOW + timedelta(seconds=60)
    assert next_sweep(NOW, 0) is None
    assert not is_due(NOW, None)  # off: never due
    assert not is_due(NOW, NOW + timedelta(seconds=1))
    assert is_due(NOW, NOW) and is_due(NOW + timedelta(seconds=5), NOW)


def test_only_live_records_past_their_expiry_are_swept_as_of_now():
    led = Ledger()
    soon = only(led.add("Expires soon", expires_at=NOW + timedelta(seconds=5)), "RecordAdded").record.id
    later = only(led.add("Expires later", expires_at=NOW + timedelta(days=5)), "RecordAdded").record.id
    gone = only(led.add("Deleted already", expires_at=NOW + timedelta(seconds=5)), "RecordAdded").record.id
    led.run(DeleteMemory(command_id=nid(), tenant="t", agent="a", issued_at=NOW, record_id=gone, session="s1"))
    sweep, events = _sweep(led, NOW + timedelta(seconds=4))
    assert (sweep.commands, events) == ([], [])  # nothing due yet
    sweep, events = _sweep(led, NOW + timedelta(seconds=5))  # expiry is inclusive, as reads count it
    assert [e.type for e in events] == ["RecordExpired"] and events[0].record.id == soon
    assert sweep.names == {f"t/a/{soon}"}
    [cmd] = sweep.commands
    assert (cmd.type, cmd.record_ids, cmd.issued_at) == ("SweepExpired", [soon], NOW + timedelta(seconds=5))
    assert (cmd.provenance.source.value, cmd.provenance.modified_by) == ("OPERATOR", MODIFIED_BY)
    assert get_record(led.state, "t/a", soon).status is Status.DELETED
    assert get_record(led.state, "t/a", later).status is Status.ACTIVE
    # Swept once: the next sweep has nothing left to name.
    assert due(led.state, NOW + timedelta(seconds=6)).commands == []


def test_records_a_waiting_sweep_named_are_not_named_again():
    led = Ledger()
    a = only(led.add("First", expires_at=NOW), "RecordAdded").record.id
    b = only(led.add("Second", expires_at=NOW), "RecordAdded").record.id
    sweep = due(led.state, NOW, asked={f"t/a/{a}"})
    assert [c.record_ids for c in sweep.commands] == [[b]]
    assert (sweep.names, sweep.waiting) == ({f"t/a/{b}"}, {f"t/a/{a}"})


def test_a_sweep_is_one_command_per_agent_and_batch_with_ids_fixed_by_time_and_batch():
    led = Ledger()
    ids = sorted(only(led.add(f"Fact {i}", expires_at=NOW), "RecordAdded").record.id for i in range(5))
    sweep = due(led.state, NOW, batch=2)
    assert [c.record_ids for c in sweep.commands] == [ids[0:2], ids[2:4], ids[4:]]
    assert [c.command_id for c in due(led.state, NOW, batch=2).commands] == [c.command_id for c in sweep.commands]
    later = due(led.state, NOW + timedelta(seconds=1), batch=2)
    assert not {c.command_id for c in later.commands} & {c.command_id for c in sweep.commands}


def test_unindexed_points_are_those_whose_dense_vector_is_in_no_graph():
    # Every point has a dense and a BM25 vector; Edge counts a sparse vector as indexed always,
    # a dense one once an optimise put it in an HNSW segment.
    assert unindexed_points(points=8000, indexed_vectors=8000) == 8000  # never optimised
    assert unindexed_points(points=8000, indexed_vectors=16000) == 0  # just optimised
    assert unindexed_points(points=8001, indexed_vectors=16001) == 1  # one written since
    assert unindexed_points(points=10, indexed_vectors=25) == 0  # never below zero


def test_an_optimise_is_due_past_the_threshold_over_what_the_last_one_left():
    assert optimize_due(unindexed=[0, 21], left=[0, 0], threshold=20)
    assert not optimize_due(unindexed=[0, 20], left=[0, 1], threshold=20)
    # A shard too small for Edge to build a graph stays unindexed after an optimise: only
    # what came since counts, or every check would start another.
    assert not optimize_due(unindexed=[25, 30], left=[25, 30], threshold=20)
    assert optimize_due(unindexed=[25, 51], left=[25, 30], threshold=20)
    assert not optimize_due(unindexed=[10**6], left=[0], threshold=0)  # 0: off
