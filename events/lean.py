"""Lean views of `memlane.memory.events` and `memlane.vectors` for the projections, and
of the event log for the ledger's own recovery.

A projection reads every event of the log, and a rebuild reads them all at once. The
ledger validated each event before it wrote it, so a projection parses only the fields it
indexes, with plain types, and keeps the raw bytes: Redis stores them as they are, and a
caller that needs the full event decodes them then. This halves the decoding cost.
"""

from __future__ import annotations

import array
import re
from datetime import datetime
from typing import Any, Literal, get_args

import msgspec

from events.codec import PLAIN, Codec, ContractError
from events.memory import RECORD_EVENTS, MemoryEvent
from events.record import Scope, Status
from events.sealing import Cipher, kid_of, subject_of
from events.topics import EVENTS, REDELIVERED
from events.vectors import float32_array, keyed_hash, vector_aad


def _type_name(cls: type) -> str:
    return get_args(cls.model_fields["type"].annotation)[0]


EventType = Literal[tuple(_type_name(c) for c in get_args(get_args(MemoryEvent)[0]))]  # type: ignore[valid-type]
RECORD_EVENT_TYPES = frozenset(_type_name(c) for c in RECORD_EVENTS)

# msgspec, not pydantic: these are decoded once per event of the log, and msgspec does it
# in well under half the time (7.5 -> 3.1 µs for a record event). Unknown fields are ignored.


def _open(c: Any, token: str, aad: bytes) -> bytes:
    """`c.open`, a token that does not match (a bad tag, bad base64) being a `ContractError`
    as in `Codec.opened`: readers skip it instead of dying on a ValueError."""
    try:
        return c.open(token, aad)
    except ValueError as e:
        raise ContractError("sealed", f"cannot open the sealed fields: {type(e).__name__}") from None


class LeanProvenance(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger's recovery reads of a record's provenance: the run that wrote it,
    whose episode links it later (`events.rules.ledger.episodes`)."""

    source: str = "TOOL"
    session: str | None = None
    execution_id: str | None = None
    episode: str | None = None


class LeanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a `MemoryRecord` that listing, expiry and search filter on."""

    id: str
    version: int
    created: datetime
    modified: datetime | None = None  # a tombstone's: when it was deleted (retention counts from it)
    superseded_at: datetime | None = None
    tenant: str
    agent: str
    scope: Scope
    session: str | None = None
    user: str | None = None
    kind: str
    summary: str
    content: str = ""
    labels: dict[str, str] = {}
    tags: list[str] = []
    expires_at: datetime | None = None
    status: Status = Status.ACTIVE
    pinned: bool = False
    replaces: str | None = None
    preview: bool = False
    key: str | None = None
    observed_at: datetime | None = None  # when its fact was said: hybrid search's time prior reads it
    provenance: LeanProvenance = LeanProvenance()
    # The personal fields (summary, content, metadata, key) sealed (events.sealing): blank
    # above until `opened` fills them. Listing, expiry and filters never need them.
    sealed: str | None = None

    def opened(self, cipher: Cipher | None) -> LeanRecord:
        """This record with its sealed fields filled in by `cipher` (itself when none are sealed).
        Raises `KeyMissing` or `KeyDestroyed` as `Codec.decode` does."""
        if self.sealed is None:
            return self
        if cipher is None:
            raise ContractError("sealed", "a sealed record, and this process has no keys")
        secret = msgspec.json.decode(_open(cipher, self.sealed, f"{self.id}#{self.version}".encode()))
        return msgspec.structs.replace(self, sealed=None, summary=secret.get("summary", ""),
                                       content=secret.get("content", ""), key=secret.get("key"))

    @property
    def text(self) -> str:
        """What gets embedded and indexed: the same as `MemoryRecord.text`. Of an opened record only."""
        if self.sealed is not None:
            raise ContractError("sealed", "the text of a sealed record: open it first (LeanRecord.opened)")
        return f"{self.summary}\n{self.content}".strip()

    @property
    def subject(self) -> str:
        """Whose data key seals it (`events.sealing`): the member it names, whatever its scope, else its agent's."""
        return subject_of(self.tenant, self.agent, self.user)

    def vector_of(self, cipher: Cipher | None) -> tuple[LeanRecord, str, str | None]:
        """(this record opened, the content hash its vector goes by, the subject the vector
        belongs to): the hash is keyed by the data key the record was sealed under, so the
        embedding worker and the projections name the same vector. A record sealed under no
        key has a plain hash and no subject. Raises as `opened` does."""
        kid = kid_of(self.sealed) if self.sealed is not None else None
        r = self.opened(cipher)
        return r, keyed_hash(r.text, kid, cipher), (self.subject if kid is not None else None)


class LeanEvent(msgspec.Struct, kw_only=True):
    type: EventType
    command_id: str
    # A command id is unique within its agent only: a wait for one matches these too.
    tenant: str = ""
    agent: str = ""
    last: bool = True
    record: LeanRecord | None = None  # set on record events only
    # What names a subject's erasure (SubjectErased) and a purge (RecordsPurged): ids only.
    user: str | None = None
    tenant_wide: bool = False
    record_ids: list[str] = []
    totals: dict[str, int] = {}  # UsageRecorded: record id -> usage_count
    merged: bool = False  # RecordAdded: a restatement merged into a live record
    occurred_at: datetime | None = None
    raw: bytes = b""  # the bytes it was decoded from (not a field of the event)

    def full(self, codec: Codec) -> Any:
        """The complete, validated event."""
        return codec.decode(EVENTS.name, self.raw)


class LeanVector(msgspec.Struct, frozen=True):
    """A `VectorComputed`, its base64 decoded by msgspec."""

    type: Literal["VectorComputed"]
    model: str
    content_hash: str
    dense: bytes = msgspec.field(name="dense_b64", default=b"")
    subject: str | None = None
    sealed: str | None = None

    def floats(self, cipher: Cipher | None) -> array.array:
        """Raises `KeyMissing` or `KeyDestroyed` for a sealed vector it cannot open."""
        if self.sealed is None:
            return float32_array(self.dense)
        if cipher is None:
            raise ContractError("sealed", "a sealed vector, and this process has no keys")
        return float32_array(_open(cipher, self.sealed, vector_aad(self.model, self.content_hash)))


class LedgerView(msgspec.Struct, kw_only=True):
    """What the ledger folds of one of its own events when it recovers: a record stays the
    JSON it was written as (`record_json`), which is how the ledger keeps it, and a
    configuration stays JSON until it is read. The full decode was three quarters of a
    recovery's time."""

    type: EventType
    command_id: str
    tenant: str
    agent: str
    occurred_at: datetime
    turn_ref: str | None = None
    committed: bool = False
    timed_out: bool = False
    command: str | None = None
    config_json: msgspec.Raw = msgspec.field(name="config", default=msgspec.Raw(b"null"))
    record_json: msgspec.Raw = msgspec.field(name="record", default=msgspec.Raw(b"null"))
    label: str | None = None  # BlockChanged
    application: str | None = None  # BlockChanged of an application-scoped block
    text: str = ""
    version: int = 0  # ProfileChanged
    agents: list[str] = []  # ConventionProposed
    kind: str = ""  # PlatformEntrySet
    chars: int = 0  # TenantFloorSet, PlatformEntrySet
    user: str | None = None  # the consent and removal events
    note_id: str | None = None  # NoteSaved, NoteForgotten
    revision: int = 0
    erased: bool = False
    tenant_wide: bool = False  # SubjectErased
    record_ids: list[str] = []  # RecordsPurged
    totals: dict[str, int] = {}  # UsageRecorded
    usage_partition: int = 0
    through_offset: int = -1
    run: str | None = None  # RunEntryAdded, RunSummarized
    entry_id: str | None = None
    entry_ids: list[str] = []
    run_last_write: datetime | None = None
    summary: str = ""
    content: str = ""


# Not strict: the contract's pydantic models accept "2" for 2, and so must its views.
_EVENT = msgspec.json.Decoder(LeanEvent, strict=False)
_LEDGER = msgspec.json.Decoder(LedgerView, strict=False)
_RECORD = msgspec.json.Decoder(LeanRecord, strict=False)
_VECTOR = msgspec.json.Decoder(LeanVector, strict=False)
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")


def _contract_error(e: msgspec.MsgspecError) -> ContractError:
    """The field msgspec names (`$.record.version` -> record.version), as `ContractError`."""
    if isinstance(e, msgspec.DecodeError) and not isinstance(e, msgspec.ValidationError):
        return ContractError("$", str(e))
    m = _AT.match(str(e))
    msg, path = m["msg"], [p for p in (m["path"] or "").split(".") if p]
    if missing := _MISSING.match(msg):
        path.append(missing["name"])
        msg = "Field required"
    return ContractError(".".join(path) or "$", msg)


def decode_lean(data: bytes) -> LeanEvent:
    """Raises `ContractError` naming the field, as `events.codec.decode` does."""
    event = _decoded(_EVENT, data)
    if (event.record is None) == (event.type in RECORD_EVENT_TYPES):
        raise ContractError("record", f"{event.type} {'needs' if event.record is None else 'takes no'} record")
    event.raw = data
    return event


def decode_logged(data: bytes, headers: Any) -> LeanEvent | None:
    """An event of the log as a projection applies it, or None for one the ledger wrote
    again for a redelivered command (`REDELIVERED`): its original came earlier in the same
    partition, and a configuration or a block carries no version to guard against the copy."""
    if (REDELIVERED, b"1") in (headers or ()):
        return None
    return decode_lean(data)


def _decoded(decoder: msgspec.json.Decoder, data: bytes) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.MsgspecError as e:
        raise _contract_error(e) from None


def decode_ledger_view(data: bytes, codec: Codec = PLAIN) -> LedgerView:
    """Opened first: the ledger's state holds the plaintext (its snapshots seal it again)."""
    return _decoded(_LEDGER, codec.opened(data))


def decode_lean_record(data: bytes) -> LeanRecord:
    """A record's JSON (as the ledger keeps it), for the fields its rules count and index."""
    return _decoded(_RECORD, data)


def decode_lean_vector(data: bytes) -> LeanVector:
    return _decoded(_VECTOR, data)


def as_lean(event: Any, codec: Codec = PLAIN) -> LeanEvent:
    """A full event (tests, the pure fold's callers) as the projections read it, sealed by `codec`."""
    return event if isinstance(event, LeanEvent) else decode_lean(codec.encode(event))
