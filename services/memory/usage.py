"""Usage recording: each read an agent's model sees is a RETRIEVED use, each query embedding `ModelUsage`."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from events.base import utcnow
from events.record import MemoryRecord
from events.rules.tokens import estimate_tokens
from events.usage import ModelUsage, PinnedListed, Retrieved, RetrievedItem
from services.memory.context import Context
from services.memory.ports import UsageRecorder

_UNSET: Any = object()


class UsageLog:
    def __init__(self, recorder: UsageRecorder, model: str) -> None:
        self.recorder = recorder
        self.model = model  # the embedder's model id, which query embeddings are recorded under

    @staticmethod
    def base(ctx: Context, turn: int | None = _UNSET) -> dict[str, Any]:
        """The fields every usage record of `ctx` carries; `turn` overrides the context's turn."""
        return dict(
            usage_id=str(uuid.uuid4()),
            tenant=ctx.tenant,
            agent=ctx.agent,
            occurred_at=utcnow(),
            session=ctx.session,
            execution_id=ctx.execution_id,
            turn=ctx.turn if turn is _UNSET else turn,
        )

    async def record(self, usage: Any) -> None:
        await self.recorder.record(usage)

    async def embedded(self, ctx: Context, text: str, latency_ms: float = 0.0, turn: int | None = _UNSET) -> None:
        await self.recorder.record(ModelUsage(**self.base(ctx, turn), purpose="embed", model=self.model,
                                              input_tokens=estimate_tokens(text), latency_ms=latency_ms))

    async def pinned(self, ctx: Context, records: list[MemoryRecord], conversation: str) -> None:
        if records:
            await self.recorder.record(PinnedListed(**self.base(ctx), conversation=conversation,
                                                    items=[RetrievedItem(id=r.id, version=r.version) for r in records]))

    async def retrieved(self, ctx: Context, tool: Literal["search_memory", "recall", "search_history"],
                        records: list[MemoryRecord],
                        conversation: str | None = None) -> None:
        if records:
            await self.recorder.record(
                Retrieved(
                    **self.base(ctx),
                    tool=tool,
                    recall=tool == "recall",
                    conversation=conversation,
                    items=[RetrievedItem(id=r.id, version=r.version) for r in records],
                )
            )
