"""What the memory service needs from the outside, as ports: adapters for Kafka serve, in-memory ones test."""

from __future__ import annotations

from typing import Protocol

from events.commands import Command
from events.usage import UsageEvent


class CommandPublisher(Protocol):
    async def send(self, command: Command, data: bytes) -> None:
        """Appends `command` (encoded as `data`, already within the command limit) to the commands log,
        or raises ApiError: LIMIT_EXCEEDED (413) when the log refuses its size, UNAVAILABLE (503) when
        it could not be written."""


class UsageRecorder(Protocol):
    async def record(self, usage: UsageEvent) -> None:
        """Enqueues one usage record; delivery happens in the background, so a read stays fast."""

