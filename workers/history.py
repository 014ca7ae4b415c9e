"""`memlane worker history`: folds committed turns into the Redis side of session history.

Only `TurnCommitted` keeps anything: a rolled-back attempt, and a retried turn's failed
attempt, end in `TurnRolledBack` and never reach the view. The checkpoint lives in
Redis with the view and changes in the same transaction, so on assignment the worker
seeks to its own checkpoint rather than trusting group offsets; with no checkpoint it
reads the topic from the start, which is how a replay rebuilds the view.
The Qdrant side of history runs in the API process, which owns its Edge shard
(workers/history_qdrant.py).
"""

from __future__ import annotations

from typing import Any

import structlog
from aiokafka import TopicPartition

from events.rules.history import KeptEvent, kept_events
from events.topics import TURNS
from events.turns import TurnCommitted
from projections.redis_history import RedisHistory
from workers.runtime import Out, Processor
from workers.topic_reader import checkpoint_key, seek_to_checkpoints

log = structlog.get_logger()


class HistoryProjector(Processor):
    name = "history"
    sources = (TURNS.name,)

    def __init__(self, settings, generation: int = 1) -> None:
        super().__init__(settings)
        self.store = RedisHistory.from_url(settings.redis_url, settings.topic_prefix, generation)
        self.pending: list[KeptEvent] = []
        self.positions: dict[str, int] = {}

    async def assigned(self, consumer, partitions: set[TopicPartition]) -> None:
        ckpts = await self.store.checkpoints()
        await seek_to_checkpoints(consumer, consumer.assignment(), ckpts)
        log.info("history_projection_seeked", checkpoints=len(ckpts))

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if isinstance(event, TurnCommitted):
            self.pending.extend(kept_events(event))
        self.positions[checkpoint_key(self.settings.topic(TURNS.name), partition)] = offset + 1
        return []

    async def batch_done(self) -> list[Out]:
        if self.positions:
            await self.store.apply(self.pending, self.positions)
            if self.pending:
                log.info("history_events_kept", events=len(self.pending))
            self.pending, self.positions = [], {}
        return []

    async def stop(self) -> None:
        await self.store.aclose()
