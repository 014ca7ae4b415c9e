"""JSON codec. Decoding refuses unknown types and bad fields, naming the field path.

A `Codec` with a cipher (the process's keyring, built by the composition root and passed to
whatever reads or writes the log) seals a message's personal fields as it encodes and opens
them as it decodes (`events.sealing`). Without one it writes plaintext and refuses sealed
messages. The module's own `encode` and `decode` are `PLAIN`'s: a platform's messages, and
logs written before encryption, need no keys.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel, TypeAdapter, ValidationError

from events.commands import Command
from events.limits import STORED
from events.memory import MemoryEvent
from events.sealing import PERSONAL, SEALED_MARK, Cipher, open_fields, seal_fields
from events.turns import TurnEvent
from events.usage import UsageEvent
from events.vectors import VectorComputed
from events.webhooks import DeadLetter, Registration

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "memlane.turns": TypeAdapter(TurnEvent),
    "memlane.memory.commands": TypeAdapter(Command),
    "memlane.memory.events": TypeAdapter(MemoryEvent),
    "memlane.vectors": TypeAdapter(VectorComputed),
    "memlane.history.vectors": TypeAdapter(VectorComputed),
    "memlane.usage": TypeAdapter(UsageEvent),
    "memlane.webhooks": TypeAdapter(Registration),
    "memlane.webhooks.dead": TypeAdapter(DeadLetter),
}


class ContractError(ValueError):
    """A message that does not match the contract. `field` is the dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


_JSON = msgspec.json.Decoder()
_NO_KEYS = "this process has no keys (encryption is off, or the codec was built without the keyring)"


class Codec:
    """The contract's codec, sealing with `cipher` (None: plaintext)."""

    def __init__(self, cipher: Cipher | None = None) -> None:
        self.cipher = cipher

    def encode(self, message: BaseModel) -> bytes:
        raw = message.model_dump_json(exclude_none=False).encode()
        if self.cipher is None or getattr(message, "type", None) not in PERSONAL:
            return raw
        as_dict = _JSON.decode(raw)
        return msgspec.json.encode(as_dict) if seal_fields(as_dict, self.cipher) else raw

    def opened(self, data: bytes | str) -> bytes | str:
        """`data` with its sealed fields opened (as it is when none are sealed). Raises
        `KeyMissing` or `KeyDestroyed` (events.sealing), or `ContractError` for a bad token."""
        mark = SEALED_MARK if isinstance(data, bytes) else SEALED_MARK.decode()
        if mark not in data:
            return data
        if self.cipher is None:
            raise ContractError("sealed", f"a sealed message, and {_NO_KEYS}")
        try:
            as_dict = _JSON.decode(data)
        except msgspec.DecodeError as e:
            raise ContractError("$", str(e)) from None
        try:
            open_fields(as_dict, self.cipher)
        except (ValueError, KeyError, TypeError) as e:
            raise ContractError("sealed", f"cannot open the sealed fields: {type(e).__name__}") from None
        return msgspec.json.encode(as_dict)

    def park(self, subject: str, where: str, data: bytes) -> bytes:
        """A dead-lettered copy of plaintext (a platform's turn) as memlane keeps it: sealed whole
        under `subject`, bound to the source offset `where`. Plaintext without a cipher."""
        if self.cipher is None:
            return data
        return msgspec.json.encode({"parked": self.cipher.seal(subject, where.encode(), data)})

    def unpark(self, data: bytes, where: str) -> bytes:
        """What `park` sealed, as it was."""
        if not data.startswith(b'{"parked"'):
            return data
        if self.cipher is None:
            raise ContractError("parked", f"a sealed dead letter, and {_NO_KEYS}")
        return self.cipher.open(_JSON.decode(data)["parked"], where.encode())

    def decode(self, topic: str, data: bytes | str) -> Any:
        return _validated(topic, self.opened(data), None)

    def decode_stored(self, topic: str, data: bytes | str) -> Any:
        """Decodes a message that was accepted before, e.g. a staged write in the ledger's state:
        the size limits of `events.limits` are skipped, so a write accepted before an upgrade
        tightened them still resolves instead of failing every later command of its agent."""
        return _validated(topic, self.opened(data), STORED)


def _validated(topic: str, data: bytes | str, context: Any) -> Any:
    adapter = _ADAPTERS.get(topic)
    if adapter is None:
        raise ContractError("topic", f"no contract for topic {topic!r}")
    try:
        return adapter.validate_json(data, context=context)
    except ValidationError as e:
        raise from_validation_error(e) from None


PLAIN = Codec()
encode = PLAIN.encode
decode = PLAIN.decode


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
