"""Which fields of a message are personal, whose key seals them, and how a message's JSON
carries them sealed. The cipher is a port (`Cipher`); `projections.keys` holds the AES-GCM
one with its keys. The choices: docs/features/encryption-and-erasure.md.

A sealed container (a message, or the record inside a record event) keeps its other fields
as they were, its personal fields blanked, and one more member, `sealed`: the token of the
personal fields' JSON. Every reader opens it before validating, so a pre-encryption log
still decodes, and the projections that index only ids, statuses and times never open it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from events.base import command_key

SEALED = "sealed"
SEALED_MARK = b'"sealed"'


class KeyMissing(Exception):
    """A token's key is not known to this process yet: the keys topic may be behind. Catch up
    on it and try again; a key still unknown then was destroyed."""

    def __init__(self, kid: str) -> None:
        super().__init__(f"data key {kid} is not known here yet")
        self.kid = kid


class KeyDestroyed(Exception):
    """A token's key was destroyed (its subject was erased, or its record's retention ended):
    what it sealed is unreadable for good. Readers skip it and count it."""

    def __init__(self, kid: str) -> None:
        super().__init__(f"data key {kid} was destroyed")
        self.kid = kid


class Cipher(Protocol):
    def seal(self, subject: str, aad: bytes, plaintext: bytes) -> str:
        """A token holding `plaintext` sealed under `subject`'s current data key."""

    def open(self, token: str, aad: bytes) -> bytes:
        """Raises `KeyMissing`, `KeyDestroyed`, or ValueError when the token or `aad` does not match."""


def subject_of(tenant: str, agent: str, user: str | None = None) -> str:
    """Whose data key seals a field: a member's on one agent (tenant + agent + user, the
    ledger's subject key), else the agent's. Ids hold no "/" or "|", so these never collide."""
    return f"{tenant}/{agent}|u:{user}" if user else f"{tenant}/{agent}"


def tenant_of(subject: str) -> str:
    return subject.split("/", 1)[0]


def agent_subject(subject: str) -> str:
    """The agent's subject a member's subject belongs to (itself for an agent's)."""
    return subject.split("|", 1)[0]


@dataclass(frozen=True)
class Personal:
    """Where a message type keeps personal fields: in `container` (a member of the message,
    or the message itself when None), the `fields` with their blank values."""

    fields: dict[str, Any]
    subject: Callable[[dict], str]
    aad: Callable[[dict], bytes]
    container: str | None = None


def _record_subject(m: dict) -> str:
    # A record made from a member's turn names them (`user`) whatever its scope: it is their
    # data, sealed under their key, so their erasure reaches it.
    r = m["record"]
    return subject_of(r["tenant"], r["agent"], r.get("user"))


def _record_aad(m: dict) -> bytes:
    # A sealed record version cannot be moved to another record or version.
    return f"{m['record']['id']}#{m['record']['version']}".encode()


def _member_subject(m: dict) -> str:
    return subject_of(m["tenant"], m["agent"], m.get("user") or (m.get("provenance") or {}).get("user"))


def _agent_subject(m: dict) -> str:
    # A block is the agent's, whoever's turn curated it: a member's erasure leaves it.
    return subject_of(m["tenant"], m["agent"])


def _command_aad(m: dict) -> bytes:
    return command_key(m["tenant"], m["agent"], m["command_id"]).encode()


def _event_aad(m: dict) -> bytes:
    return f"{m['event_id']}".encode()


RECORD_FIELDS = {"summary": "", "content": "", "metadata": {}, "key": None}
_RECORD = Personal(RECORD_FIELDS, _record_subject, _record_aad, container="record")
PERSONAL: dict[str, Personal] = {
    **{t: _RECORD for t in ("RecordAdded", "RecordSuperseded", "RecordDeleted", "RecordExpired", "RecordPinned",
                            "RecordUnpinned", "RecordRevised", "RecordRestored", "EpisodeLinked")},
    "AddMemory": Personal(RECORD_FIELDS, _member_subject, _command_aad),
    "EditMemory": Personal({"summary": None, "content": None, "metadata": None}, _member_subject, _command_aad),
    "CurateBlock": Personal({"line": None, "old": None}, _agent_subject, _command_aad),
    "BlockChanged": Personal({"text": ""}, _agent_subject, _event_aad),
    "WriteStaged": Personal({"command": ""}, _member_subject, _event_aad),
    "CommandRejected": Personal({"reason": ""}, _member_subject, _event_aad),
    "RunEntryAdded": Personal({"summary": "", "content": ""}, _member_subject, _event_aad),
    "RunSummarized": Personal({"summary": ""}, _member_subject, _event_aad),
    "SummarizeRun": Personal({"summary": ""}, _member_subject, _command_aad),
    # A member's profile is their data, sealed under their key like their USER records: their
    # erasure makes every version unreadable (docs/features/profiles.md).
    "SetProfile": Personal({"text": ""}, _member_subject, _command_aad),
    "EnrichProfile": Personal({"lines": []}, _member_subject, _command_aad),
    "ProfileChanged": Personal({"text": ""}, _member_subject, _event_aad),
    # A tenant's conventions (copied from its agents' facts) and floors: sealed under its workspace
    # agent's key, which removing the tenant destroys. Platform entries are the platform's own.
    "ProposeConvention": Personal({"text": ""}, _agent_subject, _command_aad),
    "ConventionProposed": Personal({"text": ""}, _agent_subject, _event_aad),
    "SetTenantFloor": Personal({"text": ""}, _agent_subject, _command_aad),
    "TenantFloorSet": Personal({"text": ""}, _agent_subject, _event_aad),
    # A note's text is its identity's: its member's key (else its agent's) seals it (docs/features/notes.md).
    "SaveNote": Personal({"topic": "", "summary": ""}, _member_subject, _command_aad),
    "NoteSaved": Personal({"topic": "", "summary": ""}, _member_subject, _event_aad),
    "CandidateRefused": Personal({"summary_preview": ""}, _member_subject, lambda m: m["usage_id"].encode()),
    # Why the platform rolled a turn back: its own free text, which may retell the member's words.
    "TurnOutcome": Personal({"reason": ""}, _member_subject, _command_aad),
    "WriteDiscarded": Personal({"reason": ""}, _member_subject, _event_aad),
}


def seal_fields(message: dict, cipher: Cipher) -> bool:
    """Seals `message`'s personal fields in place; False when it has none to seal."""
    spec = PERSONAL.get(message.get("type", ""))
    if spec is None:
        return False
    box = message.get(spec.container) if spec.container else message
    if not isinstance(box, dict) or SEALED in box:
        return False
    secret = {f: box[f] for f, blank in spec.fields.items() if box.get(f, blank) != blank}
    if not secret:
        return False
    for f in secret:
        box[f] = spec.fields[f]
    box[SEALED] = cipher.seal(spec.subject(message), spec.aad(message), msgspec.json.encode(secret))
    return True


def open_fields(message: dict, cipher: Cipher) -> bool:
    """Opens `message`'s sealed fields in place; False when none were sealed."""
    spec = PERSONAL.get(message.get("type", ""))
    box = (message.get(spec.container) if spec.container else message) if spec else None
    if not isinstance(box, dict) or SEALED not in box:
        return False
    token = box.pop(SEALED)
    box.update(msgspec.json.decode(cipher.open(token, spec.aad(message))))
    return True


def seal_text(cipher: Cipher, subject: str, aad: str, text: str) -> str:
    """One personal text outside a message (a block's text in a view, a history part)."""
    return cipher.seal(subject, aad.encode(), text.encode())


def open_text(cipher: Cipher, aad: str, token: str) -> str:
    return cipher.open(token, aad.encode()).decode()


def kid_of(token: str) -> str:
    return token.partition(".")[0]
