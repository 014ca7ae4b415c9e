"""Lean views of `memlane.memory.events` and `memlane.vectors` for the projections.

A projection reads every event of the log, and a rebuild reads them all at once. The
ledger validated each event before it wrote it, so a projection parses only the fields it
indexes, with plain types, and keeps the raw bytes: Redis stores them as they are, and a
caller that needs the full event decodes them then. This halves the decoding cost.
"""

from __future__ import annotations

import array
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from events.codec import decode, encode, from_validation_error
from events.memory import RECORD_EVENTS, MemoryEvent
from events.record import Scope, Status
from events.topics import EVENTS
from events.vectors import float32_array


def _type_name(cls: type) -> str:
    return get_args(cls.model_fields["type"].annotation)[0]


EventType = Literal[tuple(_type_name(c) for c in get_args(get_args(MemoryEvent)[0]))]  # type: ignore[valid-type]
RECORD_EVENT_TYPES = frozenset(_type_name(c) for c in RECORD_EVENTS)


class LeanRecord(BaseModel):
    """The fields of a `MemoryRecord` that listing, expiry and search filter on."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    version: int
    created: datetime
    tenant: str
    agent: str
    scope: Scope
    session: str | None = None
    kind: str
    summary: str
    content: str = ""
    labels: dict[str, str] = {}
    expires_at: datetime | None = None
    status: Status = Status.ACTIVE
    pinned: bool = False
    replaces: str | None = None
    preview: bool = False

    @property
    def text(self) -> str:
        """What gets embedded and indexed: the same as `MemoryRecord.text`."""
        return f"{self.summary}\n{self.content}".strip()


class LeanEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: EventType
    command_id: str
    last: bool = True
    record: LeanRecord | None = None  # set on record events only
    raw: bytes = b""

    @model_validator(mode="after")
    def _record_events_carry_records(self) -> LeanEvent:
        if (self.record is None) == (self.type in RECORD_EVENT_TYPES):
            raise ValueError(f"record: {self.type} {'needs' if self.record is None else 'takes no'} record")
        return self

    def full(self) -> Any:
        """The complete, validated event."""
        return decode(EVENTS.name, self.raw)


class LeanVector(BaseModel):
    """A `VectorComputed` whose base64 is decoded by pydantic-core, not by Python."""

    model_config = ConfigDict(frozen=True, extra="ignore", val_json_bytes="base64")

    type: Literal["VectorComputed"]
    model: str
    content_hash: str
    dense: bytes = Field(alias="dense_b64")

    def floats(self) -> array.array:
        return float32_array(self.dense)


_EVENT = TypeAdapter(LeanEvent)
_VECTOR = TypeAdapter(LeanVector)


def decode_lean(data: bytes) -> LeanEvent:
    """Raises `ContractError` naming the field, as `events.codec.decode` does."""
    try:
        event = _EVENT.validate_json(data)
    except ValidationError as e:
        raise from_validation_error(e) from None
    event.raw = data
    return event


def decode_lean_vector(data: bytes) -> LeanVector:
    try:
        return _VECTOR.validate_json(data)
    except ValidationError as e:
        raise from_validation_error(e) from None


def as_lean(event: Any) -> LeanEvent:
    """A full event (tests, the pure fold's callers) as the projections read it."""
    return event if isinstance(event, LeanEvent) else decode_lean(encode(event))
