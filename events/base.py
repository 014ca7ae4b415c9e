"""Shared base for every message: frozen, strict about unknown fields, versioned."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

# Identifiers travel in Kafka keys and Redis keys, so they stay short and printable.
IDENT_PATTERN = r"^[A-Za-z0-9._:@\-]+$"
Ident = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=IDENT_PATTERN)]
# A run's id (session memory, docs/features/session-memory.md): narrower than an Ident, as the
# product it stands in for names runs with letters, digits, ".", "_" and "-" only.
RUN_ID_PATTERN = r"^[A-Za-z0-9._\-]+$"
RunId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=RUN_ID_PATTERN)]
AppId = RunId  # an application (blocks may be scoped to one): named with the same characters


def command_key(tenant: str, agent: str, command_id: str) -> str:
    """A command id is its caller's idempotency key, unique only within the caller's agent:
    every id derived from one, every redelivery check and every wait for one goes by this.
    An Ident has no "/", so two different triples never give the same key."""
    return f"{tenant}/{agent}/{command_id}"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Message_(BaseModel):
    """Base of every event and command on a topic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
