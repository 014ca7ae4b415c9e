"""Sealing at the codec: personal fields leave a process only as ciphertext, bound to their
record and version, and come back whole; a destroyed key makes them unreadable."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from events import codec
from events.codec import PLAIN, Codec
from events.commands import AddMemory
from events.lean import decode_lean, decode_ledger_view
from events.memory import RecordAdded
from events.record import MemoryRecord, Scope
from events.sealing import KeyDestroyed, KeyMissing, subject_of
from projections.keys import Keyring, LocalKeyFile

CANARY = "canary-7f3a zebra umbrella"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _record(user: str | None = "u1", version: int = 1) -> MemoryRecord:
    return MemoryRecord(id="r1", version=version, created=NOW, modified=NOW, tenant="t", agent="a",
                        scope=Scope.USER if user else Scope.AGENT, user=user, kind="fact", summary=CANARY,
                        content=f"more {CANARY}", metadata={"where": CANARY}, key="home.city")


def _event(record: MemoryRecord) -> RecordAdded:
    return RecordAdded(event_id="e1", command_id="c1", tenant="t", agent="a", occurred_at=NOW, record=record)


def test_record_event_is_sealed_and_opens_whole(keyring, sealing):
    data = sealing.encode(_event(_record()))
    assert CANARY.encode() not in data and b"home.city" not in data
    assert sealing.decode("memlane.memory.events", data) == _event(_record())
    lean = decode_lean(data)
    assert lean.record.summary == "" and lean.record.opened(keyring).text == f"{CANARY}\nmore {CANARY}"
    assert decode_ledger_view(data, sealing).type == "RecordAdded"
    assert CANARY.encode() in bytes(decode_ledger_view(data, sealing).record_json)


def test_user_records_and_agent_records_use_their_own_subject_key(keyring, sealing):
    sealing.encode(_event(_record("u1")))
    sealing.encode(_event(_record(None)))
    assert set(keyring.subjects()) == {subject_of("t", "a", "u1"), subject_of("t", "a")}
    assert len(keyring.pending) == 2


def test_ciphertext_cannot_move_to_another_version(keyring, sealing):
    sealed = json.loads(sealing.encode(_event(_record(version=1))))
    moved = json.loads(sealing.encode(_event(_record(version=2))))
    moved["record"]["sealed"] = sealed["record"]["sealed"]
    with pytest.raises(codec.ContractError) as e:
        sealing.decode("memlane.memory.events", json.dumps(moved).encode())
    assert e.value.field == "sealed"


def test_commands_are_sealed_too(keyring, sealing):
    cmd = AddMemory(command_id="c1", tenant="t", agent="a", issued_at=NOW, summary=CANARY, user="u1")
    data = sealing.encode(cmd)
    assert CANARY.encode() not in data
    assert sealing.decode("memlane.memory.commands", data) == cmd


def test_a_rolled_back_turns_reason_is_sealed_under_its_members_key(keyring, sealing):
    from events.commands import TurnOutcome

    cmd = TurnOutcome(command_id="c2", tenant="t", agent="a", issued_at=NOW, user="u1", committed=False,
                      reason=f"the member said {CANARY}")
    data = sealing.encode(cmd)
    assert CANARY.encode() not in data and subject_of("t", "a", "u1") in keyring.subjects()
    assert sealing.decode("memlane.memory.commands", data) == cmd
    from events.memory import WriteDiscarded
    from events.record import Provenance

    discarded = WriteDiscarded(event_id="e2", command_id="c3", tenant="t", agent="a", occurred_at=NOW,
                               turn_ref="s1/1/1", reason=cmd.reason, provenance=Provenance(user="u1"))
    data = sealing.encode(discarded)
    assert CANARY.encode() not in data and sealing.decode("memlane.memory.events", data) == discarded


def test_destroyed_key_is_unreadable_and_unknown_key_is_missing(keyring, sealing, tmp_path):
    data = sealing.encode(_event(_record()))
    other = Keyring(LocalKeyFile(tmp_path / "memlane.key"))
    sealing = Codec(other)
    with pytest.raises(KeyMissing):
        sealing.decode("memlane.memory.events", data)
    for rec in keyring.pending:  # as the keys topic delivers them
        other.apply(rec.topic_key, rec.encode())
    assert sealing.decode("memlane.memory.events", data).record.summary == CANARY
    for rec in list(keyring.pending):
        other.apply(rec.topic_key, None)
    with pytest.raises(KeyDestroyed):
        sealing.decode("memlane.memory.events", data)


def test_kek_rotation_rewraps_without_touching_ciphertext(keyring, sealing, tmp_path):
    data = sealing.encode(_event(_record()))
    provider = LocalKeyFile(tmp_path / "memlane.key")
    old = provider.current
    provider.rotate()
    reader = Keyring(provider)
    for rec in keyring.pending:
        reader.apply(rec.topic_key, rec.encode())
    new = [reader.rewrapped(r) for r in reader.records()]
    assert all(r.kek != old for r in new)
    provider.retire(old)
    fresh = Keyring(LocalKeyFile(tmp_path / "memlane.key"))
    for r in new:
        fresh.apply(r.topic_key, r.encode())
    sealing = Codec(fresh)
    assert sealing.decode("memlane.memory.events", data).record.summary == CANARY


def test_without_a_cipher_messages_stay_plaintext_and_sealed_ones_are_refused(keyring, sealing):
    data = sealing.encode(_event(_record()))
    sealing = PLAIN
    assert CANARY.encode() in sealing.encode(_event(_record()))
    with pytest.raises(codec.ContractError):
        sealing.decode("memlane.memory.events", data)


def test_a_destroyed_key_names_its_subject_to_whoever_holds_its_data(keyring, sealing, tmp_path):
    sealing.encode(_event(_record()))
    reader = Keyring(LocalKeyFile(tmp_path / "memlane.key"))
    told: list[str] = []
    reader.on_destroy.append(told.append)
    for rec in keyring.pending:
        reader.apply(rec.topic_key, rec.encode())
        reader.apply(rec.topic_key, None)
        reader.apply(rec.topic_key, None)  # a tombstone read again (a replay) tells no one twice
    assert told == [subject_of("t", "a", "u1")]


def test_a_process_that_was_not_restarted_wraps_under_the_rotated_kek(tmp_path):
    running = LocalKeyFile.create(tmp_path / "memlane.key")
    rotator = LocalKeyFile(tmp_path / "memlane.key")
    new = rotator.rotate()
    version, _ = running.wrap("t", b"aad", bytes(32))
    assert version == new  # so retiring the old version strands nothing this process wraps later
