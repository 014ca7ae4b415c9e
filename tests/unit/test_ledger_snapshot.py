"""A snapshot's state decodes to the state it was taken of; one of an older format is not read."""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

import msgspec
import pytest

from events.commands import WORKSPACE, EraseSubject, GrantConsent, RemoveAgent, RemoveUser
from events.record import Provenance, Source
from tests.unit.test_ledger_rules import NOW, Ledger, _outcome_at, nid
from workers.ledger_snapshot import FORMAT, Snapshot, decode_state, encode_state, read, write

FIELDS = ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "blocks", "stats", "consent",
          "removed_agents", "removed_users", "subject_records")


def _subject_commands(led):
    op = Provenance(source=Source.OPERATOR)
    for user in ("u1", "u2"):
        led.run(GrantConsent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user=user))
        led.add(f"{user} keeps a fact", scope="USER", user=user)
    led.run(EraseSubject(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user="u2", provenance=op))
    led.run(RemoveAgent(command_id=nid(), tenant="t", agent="gone", issued_at=NOW, provenance=op))
    led.run(RemoveUser(command_id=nid(), tenant="t", agent=WORKSPACE, issued_at=NOW, user="u3", provenance=op))


def test_a_snapshot_holds_every_part_of_the_state():
    led = Ledger(labels={"customer_id": {"number": 5}}, pinned={"max_tokens": 100}, consent="required",
                 scope={"read": ["session", "user"], "write": ["session", "user"]})
    _subject_commands(led)
    led.add("pinned fact", pinned=True, labels={"customer_id": "7"}, key="plan", user="u1")
    later = NOW + timedelta(days=3)  # a later window of outcomes: turns_before holds the first
    led.add("staged, then committed", turn_ref="x:2:1", user="u1")
    _outcome_at(led, NOW, "x:2:1")
    led.add("staged, then committed later", turn_ref="x:3:1", issued_at=later, user="u1")
    _outcome_at(led, later, "x:3:1")
    led.add("staged, still open", turn_ref="x:1:1", issued_at=later, user="u1")
    led.curate("conventions", "add", line="Tabs, not spaces", user="u1")
    recent = OrderedDict([("c1", [b"e1", b"e2"]), ("c2", [b"e3"])])
    state, kept = decode_state(encode_state(led.state, recent))
    for name in FIELDS:
        assert dict(getattr(state, name)) == dict(getattr(led.state, name)), name
        assert getattr(led.state, name), f"the scenario leaves {name} empty"
    assert state.turns_since == led.state.turns_since
    assert kept == list(recent.items())
    assert state.subject_records["t/a|u:u1"] and state.subject_records["t/a|u:u2"] == ()
    assert state.stats["t/a|u:u1"]["live"] == 1


def test_a_snapshot_of_another_format_is_not_read(tmp_path):
    """Recovery then folds the partition from its start: a format 3 snapshot has no consent or
    removals, and its counts are per agent only."""
    led = Ledger()
    led.add("a fact")
    body = encode_state(led.state, OrderedDict())
    path = tmp_path / "p.snapshot"
    write(path, Snapshot(FORMAT, 7, "sha", body))
    assert read(path) == Snapshot(FORMAT, 7, "sha", body)
    write(path, Snapshot(FORMAT - 1, 7, "sha", body))
    assert read(path) is None


def test_a_state_without_the_subject_mappings_does_not_decode():
    """A body missing what format 4 adds is refused rather than read as "no consent anywhere"."""
    led = Ledger()
    led.add("a fact")
    body = msgspec.msgpack.decode(encode_state(led.state, OrderedDict()))
    del body["consent"]
    with pytest.raises(msgspec.ValidationError, match="consent"):
        decode_state(msgspec.msgpack.encode(body))
