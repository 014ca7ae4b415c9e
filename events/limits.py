"""Size limits of the contract, derived from the broker's message limit.

Every command and event is one Kafka message, and a message over the broker's limit is
refused when it is sent. A command must therefore be small enough that every event the
ledger makes of it fits too: a record event carries the whole record plus provenance, and
a staged write carries the command's JSON as a string (escaping can double it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationInfo
from pydantic_core import PydanticSerializationError, to_json

# Kafka's default `message.max.bytes` (1,048,588) less the batch framing, and aiokafka's
# default `max_request_size`. A broker configured lower needs this lowered to match.
MESSAGE_LIMIT = 1024 * 1024
# A message's key, headers (DLQ headers hold up to 2 kB of error text) and record framing.
FRAMING = 16 * 1024
# The encoded value of one event on `memlane.memory.events`.
EVENT_LIMIT = MESSAGE_LIMIT - FRAMING
# The encoded value of one command. An event holds at most about twice a command: a staged
# write its JSON escaped as a string, a record event its fields plus its provenance again;
# other records' fields that a record event carries (labels kept, a superseded version)
# are bounded by the per-field limits below. Twice this plus an envelope fits EVENT_LIMIT.
COMMAND_LIMIT = 256 * 1024

MAX_METADATA_BYTES = 16 * 1024  # as JSON, like content
MAX_METADATA_DEPTH = 8  # nested objects and arrays below the metadata object itself
MAX_METADATA_KEYS = 256  # object keys at every level together
MAX_LABELS = 14  # label numbers 5-18: no agent can declare more
MAX_LABEL_KEY_CHARS = 64
MAX_LABEL_VALUE_BYTES = 1024
MAX_TURN_REF_CHARS = 256

# Validation context for messages that were accepted before (a staged write in the ledger's
# state): limits tighten with upgrades, and an already accepted write must still decode.
STORED = {"stored": True}


def unless_stored(check: Callable[[Any], Any]) -> Callable[[Any, ValidationInfo], Any]:
    """`check` as a pydantic after-validator that a decode with the STORED context skips."""

    def run(value: Any, info: ValidationInfo) -> Any:
        if info.context and info.context.get("stored"):
            return value
        return check(value)

    return run


def check_one_line(value: str | None) -> str | None:
    """A summary is one line the agent can act on: a line break is refused, not folded away."""
    if value is not None and ("\n" in value or "\r" in value):
        raise ValueError("summary is one line; it holds a line break: put the details in content")
    return value


def one_line(text: str) -> str:
    """A model's text as one line: its line breaks and runs of spaces become single spaces."""
    return " ".join(text.split())


def check_turn_ref(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_TURN_REF_CHARS:
        raise ValueError(f"turn_ref is {len(value)} characters; the limit is {MAX_TURN_REF_CHARS}")
    return value


def check_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """Raises ValueError naming the limit. Walks iteratively, so depth is measured before
    anything recursive (the JSON encoder) sees the value."""
    keys, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels; flatten it")
        if isinstance(node, dict):
            keys += len(node)
            if keys > MAX_METADATA_KEYS:
                raise ValueError(f"metadata has more than {MAX_METADATA_KEYS} keys; the limit is {MAX_METADATA_KEYS}")
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    try:
        size = len(to_json(value))
    except PydanticSerializationError:
        raise ValueError("metadata holds a value that is not JSON text (a lone surrogate?)") from None
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} bytes")
    return value


def unencodable(s: str) -> bool:
    """Whether `s` is not UTF-8 text (it holds a lone surrogate, which JSON can spell)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


MAX_TAGS = 20
MAX_TAG_CHARS = 64


def check_tags(value: list[str]) -> list[str]:
    """Free-form tags: a few short words, each on one line, kept in order without repeats."""
    if len(value) > MAX_TAGS:
        raise ValueError(f"{len(value)} tags; the limit is {MAX_TAGS}")
    for t in value:
        if not 0 < len(t) <= MAX_TAG_CHARS or not t.isprintable() or "=" in t:
            raise ValueError(f"a tag is 1 to {MAX_TAG_CHARS} printable characters without '='; "
                             f"{t[:MAX_TAG_CHARS]!r} is not")
    return list(dict.fromkeys(value))


def check_labels(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_LABELS:
        raise ValueError(f"{len(value)} labels; the limit is {MAX_LABELS}")
    for k, v in value.items():
        if len(k) > MAX_LABEL_KEY_CHARS:
            raise ValueError(f"label name is {len(k)} characters; the limit is {MAX_LABEL_KEY_CHARS}")
        try:
            size = len(v.encode())
        except UnicodeEncodeError:
            raise ValueError("a label value holds a lone surrogate, which is not text") from None
        # The message never names the label: a name can be a secret, and refusals are logged.
        if size > MAX_LABEL_VALUE_BYTES:
            raise ValueError(f"a label value is {size} bytes; the limit is {MAX_LABEL_VALUE_BYTES} bytes")
    return value


def largest_field(message: Any) -> str:
    """The top-level field of `message` (a pydantic model) that takes most bytes as JSON:
    what a refusal of the whole message names."""
    sizes = {}
    for name in type(message).model_fields:
        try:
            sizes[name] = len(to_json(getattr(message, name)))
        except PydanticSerializationError:
            sizes[name] = 0
    return max(sizes, key=sizes.get) if sizes else "$"


def too_large(what: str, size: int, limit: int, field: str) -> str:
    return f"{what} is {size} bytes encoded, over the limit of {limit} bytes; most of it is {field}: shorten it"
