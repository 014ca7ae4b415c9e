"""What the runner parks in `<topic>.dlq` for a message it cannot handle, and how it keeps
every output under the broker's message limit: a message whose outputs would not fit is
parked instead, since sent they would fail the transaction on every restart."""

from __future__ import annotations

from typing import Any

import structlog

from events.codec import Codec
from events.limits import MESSAGE_LIMIT
from events.sealing import subject_of
from events.topics import TOPICS, TURNS
from workers.runtime.dlq import kept_on_repeat
from workers.runtime.kafka_io import dlq_headers
from workers.runtime.processor import Out

PLAINTEXT_SOURCES = (TURNS.name,)

log = structlog.get_logger()

# A record batch's own header (61 bytes in format v2) and one record's varints (lengths,
# offset and timestamp deltas, attributes), each at its widest: what a message takes on top
# of its key, value and headers, rounded up.
MESSAGE_OVERHEAD = 100
HEADER_OVERHEAD = 10  # one header's two length varints


def message_size(o: Out) -> int:
    """An upper bound of the size the producer checks against its `max_request_size` (the
    message limit): at least what the Kafka client's own estimate says, by at most ~40 bytes."""
    headers = sum(len(k.encode()) + len(v) + HEADER_OVERHEAD for k, v in o.headers)
    return len(o.key or b"") + len(o.value or b"") + headers + MESSAGE_OVERHEAD


def fits(o: Out) -> bool:
    return message_size(o) <= MESSAGE_LIMIT


def parked_value(source: str, m: Any, codec: Codec) -> bytes:
    """The platform writes turns in plaintext: memlane's copy in the DLQ is sealed under the
    agent's key (named by the message key), so an erasure reaches it (docs/features/encryption-and-erasure.md)."""
    value = m.value or b""
    if source not in PLAINTEXT_SOURCES or not value:
        return value
    tenant, _, rest = (m.key or b"").decode(errors="replace").partition("/")
    agent = rest.partition("/")[0]
    if not (tenant and agent):
        return b""  # no subject to seal it under: the headers name the source offset
    return codec.park(subject_of(tenant, agent), f"{m.topic}/{m.partition}/{m.offset}", value)


def dead_letter(source: str, m: Any, error: str, attempt: int, group: str, codec: Codec) -> Out:
    """Message `m` of registry topic `source`, parked by consumer group `group` (sealed by `codec`)."""
    out = Out(
        topic=TOPICS[source].dlq,
        key=m.key or b"",
        value=parked_value(source, m, codec),
        # Each consumer group parks what it cannot handle, so the header says which one did.
        # A replay parked again keeps its replay headers: `memlane dlq list` shows it is a repeat.
        headers=(*dlq_headers(m.topic, m.partition, m.offset, error, attempt), ("consumer_group", group.encode()),
                 *kept_on_repeat(getattr(m, "headers", None))),
    )
    if fits(out):
        return out
    # A message near the limit no longer fits with the headers: park the headers alone.
    # They name the source offset, where the message itself stays for its retention.
    return Out(out.topic, out.key, b"", (*out.headers, ("value_dropped", str(len(out.value)).encode())))


def oversized(source: str, m: Any, outs: list[Out], ctx: dict, group: str, codec: Codec) -> list[Out]:
    """A message with an output over the message limit is parked instead: sent, the output
    would fail the transaction on every restart, and the worker would never get past it."""
    big = max(outs, key=message_size)
    error = f"an output to {big.topic} is {message_size(big)} bytes, over the message limit of {MESSAGE_LIMIT} bytes"
    log.error("output_too_large", output_topic=big.topic, bytes=message_size(big), limit=MESSAGE_LIMIT, **ctx)
    return [dead_letter(source, m, error, 1, group, codec)]


def fitting(outs: list[Out], what: str) -> list[Out]:
    """Outputs of no input message (a batch's, a tick's) have nowhere to be parked: one
    over the limit is dropped, loudly, rather than failing every commit after it."""
    for o in outs:
        if not fits(o):
            log.error("output_too_large_dropped", step=what, output_topic=o.topic, bytes=message_size(o),
                      limit=MESSAGE_LIMIT)
    return [o for o in outs if fits(o)]
