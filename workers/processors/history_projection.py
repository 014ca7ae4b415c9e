"""`memlane worker history`: folds committed turns into the Redis side of session history.

Only `TurnCommitted` keeps anything: a rolled-back attempt, and a retried turn's failed
attempt, end in `TurnRolledBack` and never reach the view. The checkpoint lives in
Redis with the view and changes in the same transaction, so on assignment the worker
seeks to its own checkpoint rather than trusting group offsets; with no checkpoint it
reads the topic from the start, which is how a replay rebuilds the view.
A `MembershipChanged` (the agent joined or left a group conversation) is kept per session
as a change the reads turn into membership windows (events.rules.history.membership_windows).
It also reads `memlane.memory.events` for `SubjectErased`, whose subject's history it
drops (every other event is skipped undecoded). The Qdrant side of history runs in the
API process, which owns its Edge shard (workers/followers/history_qdrant.py).
"""

from __future__ import annotations

from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import Codec
from events.memory import SubjectErased
from events.rules.history import KeptEvent, kept_events
from events.topics import EVENTS, TURNS
from events.turns import MembershipChanged, MessageDeleted, TurnCommitted
from projections.records import Erasure, erasure_at, erasure_of
from projections.redis.connection import Connect
from projections.redis.history_view import RedisHistory
from workers.runtime.runner import Out, Processor
from workers.runtime.topic_reader import VIEW_CHECK_S, checkpoint_key, seek_to_checkpoints

log = structlog.get_logger()
def membership_of(e: MembershipChanged, offset: int) -> tuple[str, str, int, bool, int]:
    """(session key, change id, when in Unix ms, joined, order): what the view keeps of a change.
    The order is its offset in the turns topic: a session's changes share a partition (keyed
    by session), so it is their log order, which decides between changes of one millisecond."""
    return (f"{e.tenant}/{e.agent}/{e.session}", e.event_id, int(e.occurred_at.timestamp() * 1000), e.joined,
            offset)


class HistoryProcessor(Processor):
    name = "history"
    sources = (TURNS.name, EVENTS.name)
    tick_every = VIEW_CHECK_S  # a view Redis lost is folded again

    def __init__(self, settings, redis: Connect, generation: int = 1, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        self.store = RedisHistory(redis(), settings.topic_prefix, generation, codec=codec)
        self.pending: list[KeptEvent] = []
        self.erasures: list[tuple[Erasure, int]] = []
        self.memberships: list[tuple[str, str, int, bool, int]] = []
        self.deleted: list[tuple[str, str]] = []  # (session key, message id)
        self.positions: dict[str, int] = {}
        self.consumer: Any = None
        self.applied = False  # since the assignment: a checkpoint of ours should be there
        self.empty_looks = 0

    async def start(self) -> None:
        self.store.keys = self.keys

    def decode_message(self, source: str, message: Any) -> Any:
        if source == EVENTS.name:
            return erasure_of(source, message.value)
        return super().decode_message(source, message)

    async def assigned(self, consumer, partitions: set[TopicPartition]) -> None:
        ckpts = await self.store.checkpoints()
        self.consumer, self.applied = consumer, False
        await seek_to_checkpoints(consumer, consumer.assignment(), ckpts)
        log.info("history_projection_seeked", checkpoints=len(ckpts))

    async def tick(self) -> list[Out]:
        self.empty_looks = self.empty_looks + 1 if self.applied and not await self.store.checkpoints() else 0
        if self.empty_looks >= 2:  # gone twice in a row, a second apart: Redis lost the view
            log.warning("history_view_lost_refolding")
            await seek_to_checkpoints(self.consumer, self.consumer.assignment(), {})
            self.applied, self.empty_looks = False, 0
        return []

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if isinstance(event, TurnCommitted):
            self.pending.extend(kept_events(event))
        elif isinstance(event, SubjectErased):
            self.erasures.append(erasure_at(event))
        elif isinstance(event, MembershipChanged):
            self.memberships.append(membership_of(event, offset))
        elif isinstance(event, MessageDeleted):
            self.deleted.append((f"{event.tenant}/{event.agent}/{event.session}", event.message_id))
        self.positions[checkpoint_key(self.settings.topic(source), partition)] = offset + 1
        return []

    async def batch_done(self) -> list[Out]:
        if self.positions:
            await self.store.apply(self.pending, self.positions, self.erasures, self.memberships, self.deleted)
            self.applied = True
            if self.pending:
                log.info("history_events_kept", events=len(self.pending))
            if self.erasures:
                log.info("history_erased", erasures=len(self.erasures))
            if self.memberships:
                log.info("history_memberships_kept", changes=len(self.memberships))
            if self.deleted:
                log.info("history_messages_deleted", messages=len(self.deleted))
            self.pending, self.erasures, self.memberships, self.deleted, self.positions = [], [], [], [], {}
        return []

    async def stop(self) -> None:
        await self.store.aclose()
