"""Publishes an agent platform's turn events to memlane's turns topic (the `kafka` extra)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka import AIOKafkaProducer

from memlane_client.trace_context import traceparent

TURNS_TOPIC = "memlane.turns"


def turn_key(event: Any) -> bytes:
    """tenant/agent/session (`-` without a session): a session's events stay in one partition, in order."""
    get = event.get if isinstance(event, dict) else lambda k: getattr(event, k, None)
    return f"{get('tenant')}/{get('agent')}/{get('session') or '-'}".encode()


def trace_headers() -> list[tuple[str, bytes]]:
    """The caller's trace as a Kafka header: memlane's workers carry it on to the turn's records."""
    parent = traceparent()
    return [] if parent is None else [("traceparent", parent.encode())]


def turn_bytes(event: Any) -> bytes:
    """A turn event as JSON: a pydantic model (the server's own event classes) or a dict."""
    if hasattr(event, "model_dump_json"):
        return event.model_dump_json(exclude_none=False).encode()
    return json.dumps(event).encode()


class TurnPublisher:
    """Publishes turn events to `memlane.turns`, keyed by tenant/agent/session."""

    def __init__(self, bootstrap: str, topic_prefix: str = "") -> None:
        self.topic = f"{topic_prefix}{TURNS_TOPIC}"
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")

    async def __aenter__(self) -> TurnPublisher:
        await self.producer.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.producer.stop()

    async def publish(self, event: Any) -> None:
        """`event`: TurnCommitted, TurnRolledBack, SessionEnded, MembershipChanged or MessageDeleted,
        as a model or its JSON fields."""
        await self.producer.send_and_wait(self.topic, turn_bytes(event), key=turn_key(event), headers=trace_headers())

    async def publish_many(self, events: list[Any]) -> None:
        """Publishes in order without waiting for each acknowledgement (the idempotent
        producer keeps each partition's order), then waits for them all."""
        headers = trace_headers()
        futs = [await self.producer.send(self.topic, turn_bytes(e), key=turn_key(e), headers=headers) for e in events]
        await asyncio.gather(*futs)
