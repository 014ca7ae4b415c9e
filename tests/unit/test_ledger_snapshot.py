"""A snapshot's state decodes to the state it was taken of; one of an older format is not read.
Who gave each recent command survives a snapshot and a recovery from the log."""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

import msgspec
import pytest

from events.codec import PLAIN, decode
from events.commands import WORKSPACE, AddMemory, EraseSubject, GrantConsent, RemoveAgent, RemoveUser
from events.record import Provenance, Source
from events.rules.ledger import LedgerState, caller, command_key
from events.topics import COMMANDS, EVENTS
from settings import Settings
from tests.unit.test_ledger_rules import NOW, Ledger, _outcome_at, nid
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands, caller_of
from workers.processors.ledger.snapshot_file import FORMAT, Snapshot, decode_state, encode_state, read, write

FIELDS = ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "blocks", "stats", "consent",
          "granted_at", "erased_at", "removed_agents", "removed_users", "subject_records", "erasures")


def _subject_commands(led):
    op = Provenance(source=Source.OPERATOR)
    for user in ("u1", "u2"):
        led.run(GrantConsent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user=user,
                             provenance=Provenance(source=Source.MEMBER)))
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
    recent = OrderedDict([("c1", [b"e1", b"e2"]), ("c2", [b"e3"]), ("c3", [b"e4"])])
    callers = {"c1": "caller-1", "c2": None}  # c3's caller is not known either
    state, kept, dropped = decode_state(encode_state(led.state, recent, callers))
    assert dropped == 0
    for name in FIELDS:
        assert dict(getattr(state, name)) == dict(getattr(led.state, name)), name
        assert getattr(led.state, name), f"the scenario leaves {name} empty"
    assert state.turns_since == led.state.turns_since
    assert kept == [("c1", "caller-1", [b"e1", b"e2"]), ("c2", None, [b"e3"]), ("c3", None, [b"e4"])]
    assert state.subject_records["t/a|u:u1"] and "t/a|u:u2" not in state.subject_records  # u2 was erased
    # u1's fact, the pinned one and the two committed in turns: a write naming a member takes user scope.
    assert state.stats["t/a|u:u1"]["live"] == 4
    assert state.granted_at == {"t/a|u:u1": NOW, "t/a|u:u2": NOW} and state.erased_at == {"t/a|u:u2": NOW}


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


@pytest.mark.parametrize("name", ["granted_at", "erased_at"])
def test_a_state_without_the_times_of_grants_and_erasures_does_not_decode(name):
    """Read as "none", a format 4 body would take a late write of an erased member's memory."""
    body = msgspec.msgpack.decode(encode_state(Ledger().state, OrderedDict()))
    del body[name]
    with pytest.raises(msgspec.ValidationError, match=name):
        decode_state(msgspec.msgpack.encode(body))


# --------------------------------------------------------------------------- who gave a recent command


def _alice(**kw):
    return AddMemory(command_id="idem-1", tenant="t", agent="a", issued_at=kw.pop("issued_at", NOW), user="alice",
                     session="s1", summary="Alice's PIN hint is her cat's name", scope="USER",
                     provenance=Provenance(source=Source.TOOL, user="alice", session="s1"), **kw)


def _bob():
    return _alice(issued_at=NOW + timedelta(seconds=1)).model_copy(update={
        "user": "bob", "provenance": Provenance(source=Source.TOOL, user="bob", session="s1")})


def _ledger(state, recent) -> LedgerProcessor:
    ledger = LedgerProcessor(Settings(), codec=PLAIN)
    ledger.states[0], ledger.processed[0] = state, recent
    return ledger


async def _codes(ledger, cmd, offset):
    outs = await ledger.process(COMMANDS.name, 0, offset, cmd)
    return [(e.type, getattr(e, "code", None)) for e in (decode(EVENTS.name, o.value) for o in outs)], outs


async def test_every_event_names_its_caller_and_a_snapshot_keeps_it():
    """After a restart from a snapshot, another caller reusing an id is still refused, and the
    first caller's retry still answered."""
    live = _ledger(Ledger(scope={"read": ["user"], "write": ["user"]}).state, RecentCommands())
    _, first = await _codes(live, _alice(), 0)
    assert all(caller_of(o.headers) == caller(_alice()) for o in first) and first
    body = encode_state(live.states[0], live.processed[0].events, live.processed[0].callers)
    state, recent, _ = decode_state(body)
    restarted = _ledger(state, RecentCommands.restored(recent))
    assert (await _codes(restarted, _bob(), 1))[0] == [("CommandRejected", "DUPLICATE_ID")]
    _, again = await _codes(restarted, _alice(issued_at=NOW + timedelta(seconds=2)), 2)
    assert [o.value for o in again] == [o.value for o in first]


async def test_a_recovery_from_the_log_reads_the_callers_from_the_events_headers():
    """What `LedgerProcessor._recover` does with each event it reads (the whole of it runs
    against Kafka in tests/integration/test_ledger_snapshot.py); an event logged without the
    header answers no caller: a reuse is refused rather than guessed to be a retry."""
    live = _ledger(Ledger(scope={"read": ["user"], "write": ["user"]}).state, RecentCommands())
    _, first = await _codes(live, _alice(), 0)
    for headers, retry in ((lambda o: o.headers, [("RecordAdded", None)]),
                           (lambda o: (), [("CommandRejected", "DUPLICATE_ID")])):
        recent = RecentCommands()
        for o in first:
            e = decode(EVENTS.name, o.value)
            recent.add(command_key(e.tenant, e.agent, e.command_id), o.value, caller_of(headers(o)))
        recovered = _ledger(LedgerState(), recent)
        assert (await _codes(recovered, _bob(), 1))[0] == [("CommandRejected", "DUPLICATE_ID")]
        assert (await _codes(recovered, _alice(issued_at=NOW + timedelta(seconds=2)), 2))[0] == retry
