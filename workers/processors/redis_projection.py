"""Folds `memlane.memory.events` into Redis (records, versions, listing, pins), and drops
what `SubjectErased` and `RecordsPurged` name (`RedisRecords.purge`).

The checkpoint lives in Redis with the view, written by the same Lua call, so on
assignment the worker seeks to its own checkpoint rather than trusting group offsets. A view
whose checkpoints are gone while the worker runs (Redis lost its data) is folded again from
the start of the log.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import Codec
from events.lean import decode_logged
from events.topics import EVENTS
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from workers.runtime.runner import Out, Processor, metrics
from workers.runtime.topic_reader import VIEW_CHECK_S, checkpoint_key, seek_to_checkpoints, tp_key

log = structlog.get_logger()


class RedisProjectionProcessor(Processor):
    name = "redis-projection"
    sources = (EVENTS.name,)
    catch_up_on_start = True  # /ready: once the view holds what the log held when assigned
    tick_every = VIEW_CHECK_S

    def __init__(self, settings, redis: Connect, generation: int | None = None, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        # It announces what it applies: API requests with `wait=true` wait for that.
        self.store = RedisRecords(redis(pooled=True), generation, settings.topic_prefix, announce=True, codec=codec)
        self.pending: list[Any] = []
        self.positions: list[tuple[str, int]] = []
        self.assignment: set[TopicPartition] = set()
        self.generation: int | None = None
        self.topic = settings.topic(EVENTS.name)
        self.consumer: Any = None
        self.applied = False  # since the assignment: a checkpoint of ours should be there
        self.empty_looks = 0

    async def start(self) -> None:
        # Block texts are sealed in the view, and records under destroyed keys left out.
        self.store.keys = self.keys

    def decode_message(self, source: str, message: Any) -> Any:
        return decode_logged(message.value, message.headers)

    async def assigned(self, consumer, partitions: set[TopicPartition]) -> None:
        self.assignment = set(consumer.assignment())
        self.consumer, self.applied = consumer, False
        self.generation = await self.store.generation()
        ckpts = await self.store.checkpoints(self.generation)
        await seek_to_checkpoints(consumer, self.assignment, ckpts)
        log.info("projection_seeked", generation=self.generation, checkpoints=len(ckpts))

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if event is not None:
            self.pending.append(event)
        self.positions.append((checkpoint_key(self.topic, partition), offset + 1))
        return []

    async def batch_done(self) -> list[Out]:
        if self.positions:  # a batch of skipped copies still moves the checkpoint on
            await self.store.apply(self.pending, self.positions)
            self.applied = True
            metrics.PROJECTION_APPLIED.labels("redis").inc(len(self.pending))
            self.pending, self.positions = [], []
        return []

    async def tick(self) -> list[Out]:
        # The live generation's: a rebuild swaps generations under a running projection.
        self.empty_looks = self.empty_looks + 1 if self.applied and not await self.store.checkpoints() else 0
        if self.empty_looks >= 2:  # gone twice in a row, a second apart: Redis lost the view
            self.generation = await self.store.generation()
            log.warning("redis_view_lost_refolding", generation=self.generation)
            await seek_to_checkpoints(self.consumer, self.assignment, {})
            self.applied, self.empty_looks = False, 0
        return []

    async def sample(self, ends: dict[TopicPartition, int]) -> None:
        """The generation written to, and how far its checkpoint (in Redis, with the view) trails the log."""
        gen = await self.store.generation()
        ckpts = await self.store.checkpoints(gen)
        metrics.PROJECTION_GENERATION.labels("redis").set(gen)
        metrics.PROJECTION_CHECKPOINT_LAG.labels("redis").set(
            sum(max(0, end - ckpts.get(tp_key(tp), 0)) for tp, end in ends.items()))

    async def stop(self) -> None:
        await self.store.aclose()
