"""Writes the ledger accepted before an upgrade tightened the limits still decode.

A staged write is re-read from the ledger's state when its turn resolves or times out; if
the new limits applied there, every later command of that agent would be refused.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events import AddMemory, TurnOutcome
from events.codec import PLAIN, ContractError, decode, encode
from events.rules.ledger import TURN_TIMEOUT, LedgerState, decide, evolve
from events.topics import COMMANDS

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def old_staged_write(**update) -> AddMemory:
    """Built without validation, as a command decoded before the limits existed."""
    cmd = AddMemory(command_id="old", tenant="t", agent="a", issued_at=NOW, summary="s", session="s", turn_ref="turn-1")
    return cmd.model_copy(update={"metadata": {"blob": "m" * 20_000}, **update})


def staged_state() -> LedgerState:
    state = LedgerState()
    [staged] = decide(state, old_staged_write())
    assert staged.type == "WriteStaged"
    evolve(state, staged)
    return state


def test_a_later_plain_write_applies_after_an_old_staged_write_times_out():
    state = staged_state()
    later = AddMemory(command_id="new", tenant="t", agent="a", issued_at=NOW + TURN_TIMEOUT * 2, summary="fresh",
                       session="s")
    events = decide(state, later)
    assert [e.type for e in events] == ["TurnResolved", "WriteDiscarded", "RecordAdded"]
    assert events[-1].record.summary == "fresh"


def test_an_old_staged_write_commits_with_its_turn():
    state = staged_state()
    outcome = TurnOutcome(command_id="o", tenant="t", agent="a", issued_at=NOW, turn_ref="turn-1", committed=True)
    events = decide(state, outcome)
    assert [e.type for e in events] == ["TurnResolved", "RecordAdded"]
    assert len(events[-1].record.metadata["blob"]) == 20_000


def test_a_new_command_over_the_limits_is_still_refused():
    for update in ({}, {"labels": {f"l{n}": "v" for n in range(20)}}, {"turn_ref": "r" * 300}):
        raw = encode(old_staged_write(**update))
        assert PLAIN.decode_stored(COMMANDS.name, raw) == old_staged_write(**update)
        with pytest.raises(ContractError) as e:
            decode(COMMANDS.name, raw)
        assert e.value.field in ("labels", "metadata", "turn_ref")
