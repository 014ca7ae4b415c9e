"""What the record view stores, and opening it: a version is the event's raw bytes with its
personal fields sealed (`events.sealing`), and a block's text is sealed under its agent's key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, TypeAdapter

from events.codec import Codec, ContractError
from events.lean import LeanRecord, decode_lean
from events.record import MemoryRecord
from events.sealing import Cipher, open_text, seal_text, subject_of

SEALED_BLOCK = "sealed:"  # what starts a sealed block text in the view


def block_aad(tenant: str, agent: str, label: str) -> str:
    """A sealed block text is bound to its agent and label: it cannot be moved to another."""
    return f"block:{tenant}/{agent}/{label}"


def seal_block(cipher: Cipher | None, tenant: str, agent: str, label: str, text: str) -> str:
    if cipher is None:
        return text
    return SEALED_BLOCK + seal_text(cipher, subject_of(tenant, agent), block_aad(tenant, agent, label), text)


def open_block(cipher: Cipher | None, tenant: str, agent: str, label: str, stored: str) -> str:
    """Raises `KeyMissing` or `KeyDestroyed`. A text stored before sealing reads as it is."""
    if not stored.startswith(SEALED_BLOCK):
        return stored
    if cipher is None:
        raise ContractError("sealed", "a sealed block, and this process has no keys")
    return open_text(cipher, block_aad(tenant, agent, label), stored[len(SEALED_BLOCK):])


def lean_record(raw: str) -> LeanRecord | None:
    """The unsealed fields of a stored version (ids, status, kind, scope, member), or None
    for one that does not decode."""
    try:
        return decode_lean(raw.encode()).record
    except ContractError:
        return None


def snapshot(raw: str, codec: Codec) -> MemoryRecord:
    """The record a stored version holds: the raw event that made it, opened by `codec`. Raises
    `KeyMissing` or `KeyDestroyed` (events.sealing) for a record it cannot open."""
    return _STORED.validate_json(codec.opened(raw)).record


def made(raw: str, codec: Codec) -> tuple[str, MemoryRecord]:
    """A stored version and the command that made it. Raises as `snapshot` does."""
    stored = _STORED.validate_json(codec.opened(raw))
    return stored.command_id, stored.record


class _Stored(BaseModel):
    model_config = ConfigDict(extra="ignore")
    command_id: str = ""
    record: MemoryRecord


_STORED = TypeAdapter(_Stored)
