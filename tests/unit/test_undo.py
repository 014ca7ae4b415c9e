"""Undo: the plan puts each record a command, turn or session touched back to the version before
it, lists later writes of others that depend on it, and the ledger applies it only to records
still where the plan saw them; an undo is undone like any command."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from events import AddMemory, AgentConfig, ConfigureAgent, DeleteMemory, PinMemory
from events.commands import UndoWrites
from events.record import Provenance, Source, Status
from events.rules import undo
from events.rules.ledger import LedgerState, decide, evolve, get_record

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OP = Provenance(source=Source.OPERATOR, modified_by="undo")


class Agent:
    """A ledger of one agent that keeps each record's versions with the command that made them."""

    def __init__(self) -> None:
        self.state, self.versions, self.clock = LedgerState(), {}, count()
        cfg = AgentConfig.model_validate({"memory": {"pinned": {"max_tokens": 200}}})
        self.run(ConfigureAgent, "cfg", config=cfg)

    def run(self, cls, cid: str, **fields) -> list:
        cmd = cls(command_id=cid, tenant="t", agent="a", issued_at=T0 + timedelta(seconds=next(self.clock)), **fields)
        events = decide(self.state, cmd)
        for e in events:
            evolve(self.state, e)
            if hasattr(e, "record") and e.type != "CommandRejected":
                # The first event of a version made it, as the record view keeps it.
                self.versions.setdefault(e.record.id, {}).setdefault(e.record.version,
                                                                     undo.Version(e.command_id, e.record))
        return events

    def add(self, cid: str, summary: str, **fields) -> str:
        [e] = [e for e in self.run(AddMemory, cid, summary=summary, session="s1", **fields) if e.type == "RecordAdded"]
        return e.record.id

    def plan(self, target: str, ref: str) -> undo.Plan:
        return undo.plan((list(v.values()) for v in self.versions.values()), undo.matcher(target, ref))

    def undo(self, cid: str, target: str, ref: str) -> list:
        return self.run(UndoWrites, cid, target=target, ref=ref, changes=self.plan(target, ref).changes,
                        provenance=OP)

    def now(self, rid: str):
        return get_record(self.state, "t/a", rid)


def test_an_undone_command_takes_back_what_it_added_and_leaves_later_unrelated_writes():
    a = Agent()
    tea = a.add("c1", "likes tea")
    later = a.add("c2", "lives in Porto")
    events = a.undo("u1", "command", "c1")
    assert [e.type for e in events] == ["RecordDeleted"]
    assert a.now(tea).status is Status.DELETED and a.now(tea).version == 2
    assert a.now(later).status is Status.ACTIVE and a.now(later).version == 1
    # The undo is itself undone: tea is back, as it was.
    assert [e.type for e in a.undo("u2", "command", "u1")] == ["RecordRestored"]
    assert (a.now(tea).status, a.now(tea).version) == (Status.ACTIVE, 3)


def test_a_replacement_undone_brings_the_replaced_record_back_and_tombstones_its_successor():
    a = Agent()
    old = a.add("c1", "the office closes at six")
    new = a.add("c2", "the office closes at seven", replaces=old)
    assert a.now(old).status is Status.SUPERSEDED
    a.undo("u1", "command", "c2")
    assert a.now(old).status is Status.ACTIVE and a.now(old).replaced_by is None
    assert a.now(new).status is Status.DELETED


def test_a_later_write_of_another_command_depends_on_the_undone_one():
    a = Agent()
    tea = a.add("c1", "likes tea")
    a.run(PinMemory, "c2", record_id=tea, session="s1")
    plan = a.plan("command", "c1")
    assert [str(d) for d in plan.dependents] == [f"record {tea} version 2 (command c2)"]
    # Undoing the pin alone depends on nothing: the record goes back to unpinned.
    pin = a.plan("command", "c2")
    assert not pin.dependents and [(c.status, c.pinned) for c in pin.changes] == [(Status.ACTIVE, False)]


def test_a_delete_undone_restores_the_record_and_a_plan_gone_stale_is_refused():
    a = Agent()
    tea = a.add("c1", "likes tea", pinned=True)
    a.run(DeleteMemory, "c2", record_id=tea, session="s1")
    stale = a.plan("command", "c2")
    a.run(AddMemory, "c3", summary="likes coffee", session="s1")  # unrelated: the plan still holds
    a.run(UndoWrites, "u1", target="command", ref="c2", changes=stale.changes, provenance=OP)
    assert (a.now(tea).status, a.now(tea).pinned) == (Status.ACTIVE, True)
    [refused] = a.run(UndoWrites, "u2", target="command", ref="c2", changes=stale.changes, provenance=OP)
    assert (refused.type, refused.code, refused.field) == ("CommandRejected", "VERSION_CONFLICT",
                                                          "changes.0.expected_version")


def test_a_turn_and_a_session_are_named_by_their_writes_provenance():
    a = Agent()
    a.add("c1", "said in turn 4", provenance=Provenance(session="s1", turn=4))
    a.add("c2", "said in turn 5", provenance=Provenance(session="s1", turn=5))
    a.add("c3", "said elsewhere", provenance=Provenance(session="s2", turn=4))
    assert a.plan("turn", "s1/4").touched == 1 and a.plan("session", "s1").touched == 2
    with pytest.raises(ValueError, match="<session>/<turn number>"):
        undo.matcher("turn", "s1")
