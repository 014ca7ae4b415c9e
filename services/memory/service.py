"""The memory service: its reads and its command submission over one record view, and the usage they record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from events.config import AgentConfig
from events.errors import ErrorCode
from events.rules import subjects
from services.errors import ApiError
from services.memory.commands import MemoryCommands
from services.memory.context import Context
from services.memory.fair_embedding import FairEmbedding
from services.memory.merge import MergeCheck
from services.memory.notes import MemoryNotes, Visible
from services.memory.past import PastView
from services.memory.ports import CommandPublisher, UsageRecorder
from services.memory.profiles import MemoryProfiles
from services.memory.reads import MemoryReads
from services.memory.rules import check_role
from services.memory.tenant import TenantMemory
from services.memory.undo import MemoryUndo
from services.memory.usage import UsageLog
from settings import Settings
from workers.followers.past_memory import Point

if TYPE_CHECKING:
    from projections.embedders.port import Embedder
    from projections.redis.record_view import RedisRecords
    from workers.followers.memory_shards import MemoryShards
    from workers.followers.past_index import PastIndexes
    from workers.followers.past_memory import Past, PastMemory


class MemoryService:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None, embedder: Embedder,
                 publisher: CommandPublisher, recorder: UsageRecorder, visible: Visible | None = None,
                 past: PastMemory | None = None, past_indexes: PastIndexes | None = None) -> None:
        self.settings = settings
        self.past_memory = past  # folds an agent's log up to a point, for `as_of` reads
        self.past_indexes = past_indexes  # indexes of the records live at a point, for `as_of` searches
        self.embedder = embedder
        self.records = records
        self.usage = UsageLog(recorder, embedder.model_id if embedder is not None else "embedder")
        self.fair = FairEmbedding(embedder, settings.embed_slots, settings.tenant_queued_texts)
        self.reads = MemoryReads(settings, records, memory, embedder, self.usage, fair=self.fair)
        self.commands = MemoryCommands(settings, records, memory, publisher)
        self.commands.merge = MergeCheck(records, embedder) if embedder is not None else None
        self.notes = MemoryNotes(self.commands, visible)  # docs/features/notes.md
        self.reads.layer_sources.append(self.notes.layer)
        self.profiles = MemoryProfiles(self.reads, self.commands)  # docs/features/profiles.md
        self.reads.layer_sources.append(self.profiles.layer)
        self.tenant = TenantMemory(self.commands)  # docs/features/tenant-platform-memory.md
        self.undo = MemoryUndo(self.commands)  # docs/features/time-travel.md
        self.reads.layer_sources.append(self.tenant.layers)

    async def reads_at(self, ctx: Context, as_of: str | None, ranked: bool = False) -> MemoryReads:
        """The reads of now, or of memory as it stood at `as_of` (`Point.parse`)."""
        if as_of is None:
            return self.reads
        try:
            point = Point.parse(as_of)
        except ValueError as e:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "as_of", str(e), 422) from None
        return await self.past(ctx, point, ranked)

    async def past_view(self, ctx: Context, point: Point) -> PastView:
        """The agent's record view as it stood at `point`."""
        return PastView(self.records, (await self._past(ctx, point)).fold, (ctx.tenant, ctx.agent))

    async def _past(self, ctx: Context, point: Point) -> Past:
        if self.past_memory is None:
            raise ApiError(ErrorCode.UNAVAILABLE, "as_of", "as_of: this API reads no log; ask one that serves", 503)
        try:
            memory = self.reads.memory
            served = None if memory is None else (lambda tenant, agent: memory.position(tenant, agent)[1])
            return await self.past_memory.past(ctx.tenant, ctx.agent, point, served)
        except ValueError as e:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "as_of", str(e), 422) from None

    async def past(self, ctx: Context, point: Point, ranked: bool = False) -> MemoryReads:
        """The reads of memory as it stood at `point`: listing, one record and its versions, and
        with `ranked` search and recall, over an index of the records live then."""
        past = await self._past(ctx, point)
        view = PastView(self.records, past.fold, (ctx.tenant, ctx.agent))
        if not ranked:
            return self.reads.over(view, at=past.at)
        if self.past_indexes is None:
            raise ApiError(ErrorCode.UNAVAILABLE, "as_of", "as_of: this API keeps no index of the past; ask one "
                           "that serves", 503)

        async def embed(texts: list[str]) -> list[list[float]]:
            return await self.fair.embed(ctx.tenant, texts)

        index = await self.past_indexes.index(past, self.reads.memory, embed)
        return self.reads.over(view, memory=index, at=past.at)

    def use_shards(self, memory: MemoryShards) -> None:
        self.reads.memory = self.commands.memory = memory

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.reads.config(tenant, agent)

    async def consent(self, ctx: Context) -> dict[str, Any]:
        """A member's consent on the agent and whether they get memory now (and why not): the
        member's own key, or an agent or operator key naming the member (X-User)."""
        check_role(ctx, ("member", "agent", "operator"), "read a member's consent")
        if ctx.user is None:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-user", "x-user: name the member whose consent to read "
                           "(X-User)", 422)
        cfg = await self.config(ctx.tenant, ctx.agent)
        state = await self.records.subject(ctx.tenant, ctx.agent, ctx.user)
        why = subjects.refusal(cfg, ctx.user, ctx.channel, state)
        return {
            "tenant": ctx.tenant,
            "agent": ctx.agent,
            "user": ctx.user,
            "required": subjects.consent_needed(cfg),
            "consent": state.consent,
            "memory": why is None,
            "refusal": None if why is None else {"code": why.code.value, "field": why.field, "reason": why.reason},
        }
