"""JSON codec. Decoding refuses unknown types and bad fields, naming the field path."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from events.commands import Command
from events.limits import STORED
from events.memory import MemoryEvent
from events.turns import TurnEvent
from events.usage import UsageEvent
from events.vectors import VectorComputed

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "memlane.turns": TypeAdapter(TurnEvent),
    "memlane.memory.commands": TypeAdapter(Command),
    "memlane.memory.events": TypeAdapter(MemoryEvent),
    "memlane.vectors": TypeAdapter(VectorComputed),
    "memlane.usage": TypeAdapter(UsageEvent),
}


class ContractError(ValueError):
    """A message that does not match the contract. `field` is the dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json(exclude_none=False).encode()


def decode(topic: str, data: bytes | str) -> Any:
    adapter = _ADAPTERS.get(topic)
    if adapter is None:
        raise ContractError("topic", f"no contract for topic {topic!r}")
    try:
        return adapter.validate_json(data)
    except ValidationError as e:
        raise from_validation_error(e) from None


def decode_stored(topic: str, data: bytes | str) -> Any:
    """Decodes a message that was accepted before, e.g. a staged write in the ledger's state:
    the size limits of `events.limits` are skipped, so a write accepted before an upgrade
    tightened them still resolves instead of failing every later command of its agent."""
    adapter = _ADAPTERS.get(topic)
    if adapter is None:
        raise ContractError("topic", f"no contract for topic {topic!r}")
    try:
        return adapter.validate_json(data, context=STORED)
    except ValidationError as e:
        raise from_validation_error(e) from None


def from_validation_error(e: ValidationError) -> ContractError:
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"]]
    # A discriminated union puts the tag first in the path; drop it so the path is the field.
    if loc and err["type"] not in ("union_tag_invalid", "union_tag_not_found") and len(loc) > 1:
        if loc[0][0].isupper():
            loc = loc[1:]
    field = ".".join(loc) or "type"
    msg = err["msg"]
    if err["type"] == "json_invalid":
        field = "$"
    elif err["type"] == "union_tag_invalid":
        field = "type"
        msg = f"unknown type {err.get('input', {}).get('type')!r}" if isinstance(err.get("input"), dict) else msg
    elif err["type"] == "union_tag_not_found":
        field = "type"
        msg = "missing discriminator field 'type'"
    return ContractError(field, msg)
