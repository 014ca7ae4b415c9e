"""What the memory service needs from the outside, as ports: adapters for Kafka serve, in-memory ones test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from events.codec import Codec
from events.commands import Command
from events.usage import UsageEvent

if TYPE_CHECKING:
    from events.config import AgentConfig
    from events.rules.recall_render import Entry
    from services.memory.context import Context


class CommandPublisher(Protocol):
    codec: Codec  # encodes the commands it is given, sealing their personal fields

    async def send(self, command: Command, data: bytes) -> None:
        """Appends `command` (encoded as `data`, already within the command limit) to the commands log,
        or raises ApiError: LIMIT_EXCEEDED (413) when the log refuses its size, UNAVAILABLE (503) when
        it could not be written."""


class UsageRecorder(Protocol):
    async def record(self, usage: UsageEvent) -> None:
        """Enqueues one usage record; delivery happens in the background, so a read stays fast."""



@dataclass(frozen=True)
class RecallAsk:
    """One recall, as a layer source sees it: who asks, the agent's configuration, the turn's
    text and the run and application it names."""

    ctx: Context
    cfg: AgentConfig
    text: str
    conversation: str
    run: str | None = None
    application: str | None = None


class LayerSource(Protocol):
    async def __call__(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """Entries for recall's shared layers (`events.rules.recall_render.SHARED`), by layer
        heading, best first; only what `ask.ctx` may read. Read while the search runs."""
