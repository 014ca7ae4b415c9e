"""Memory reads: search, recall, listing, reading a record and its history.

Reads come from the projections (Qdrant for ranking, Redis for records). Every rule that
protects one agent from another is applied here, on top of the filters the index applies.
`MemoryReads` holds the subject rules and the blocks; search (`search`, `batch_search`),
recall (`recall`) and listing (`listing`) have modules beside it and read through it.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime
from typing import TYPE_CHECKING, Any

from events.base import utcnow
from events.commands import WORKSPACE, block_of_field
from events.config import AgentConfig
from events.record import Scope
from events.rules.subjects import Refusal, SubjectState, refusal
from events.rules.visibility import readable_scopes
from projections.records import Page
from services.errors import ApiError
from services.memory import member_reads
from services.memory.batch_search import BatchSearch
from services.memory.context import Context
from services.memory.fair_embedding import FairEmbedding
from services.memory.listing import MemoryListing
from services.memory.ports import LayerSource
from services.memory.recall import MemoryRecall, RecallResult
from services.memory.recall import block_title as _block_title
from services.memory.recalled import RecalledVersions
from services.memory.rules import NOT_MEMBER, check_enabled, check_role, refused
from services.memory.search import EMBED_MS, MemorySearch, SearchResult
from services.memory.usage import UsageLog
from settings import Settings

if TYPE_CHECKING:
    from events.record import MemoryRecord
    from projections.embedders.port import Embedder
    from projections.redis.record_view import RedisRecords
    from workers.followers.memory_shards import MemoryShards

# What other modules import from here, from before search, recall and listing had modules of their own.
__all__ = ["EMBED_MS", "MemoryReads", "RecallResult", "SearchResult", "_block_title"]


class MemoryReads:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None, embedder: Embedder,
                 usage: UsageLog, recalled: RecalledVersions | None = None, fair: FairEmbedding | None = None) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory  # the shards of the current generation; swapped with it
        self.embedder = embedder
        # Queries are embedded through each tenant's queue, in turn (docs/features/fairness.md).
        self.fair = fair or FairEmbedding(embedder, settings.embed_slots, settings.tenant_queued_texts)
        self.usage = usage
        self.at: datetime | None = None  # a past point's moment (`over`), else None: now
        self.recalled = recalled or RecalledVersions(records)
        # Recall's shared layers (profiles, notes, tenant and platform memory): each source
        # is read beside the search (`RecallAsk` in, entries by layer heading out).
        self.layer_sources: list[LayerSource] = []
        # Each reads what it needs through this object, so a swapped index or view reaches it.
        self._searching = MemorySearch(self)
        self._batch = BatchSearch(self, self._searching)
        self._recalling = MemoryRecall(self, self._searching)
        self._listing = MemoryListing(self)

    def over(self, records: Any, memory: Any = None, at: datetime | None = None) -> MemoryReads:
        """These reads over another record view and index: memory as it stood at a past point
        (`past.PastView`), whose moment `at` is when records must have been in force. Such reads
        record no use: they show what was, to no model."""
        clone = copy.copy(self)
        clone.records = records
        clone.memory = memory if memory is not None else self.memory
        clone.at = at
        clone._searching = MemorySearch(clone)
        clone._batch = BatchSearch(clone, clone._searching)
        clone._recalling = MemoryRecall(clone, clone._searching)
        clone._listing = MemoryListing(clone)
        return clone

    def now(self) -> datetime:
        """The moment whose records in force these reads show: now, or a past point's."""
        return self.at or utcnow()

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.records.config(tenant, agent) or AgentConfig()

    def _check_enabled(self, ctx: Context, cfg: AgentConfig) -> None:
        check_enabled(ctx, cfg, self.settings.memory_kill_switch)

    # ------------------------------------------------------------------ subjects

    def _subject_user(self, ctx: Context) -> str | None:
        """The member whose subject a call reads: an operator's call reads no member's."""
        return None if ctx.principal.role == "operator" else ctx.user

    async def _state(self, ctx: Context) -> SubjectState:
        return await self.records.subject(ctx.tenant, ctx.agent, self._subject_user(ctx))

    def _refusal(self, ctx: Context, cfg: AgentConfig, state: SubjectState) -> Refusal | None:
        """Why `ctx` gets no memory now. An agent or helper key asks the one rule every entry
        point asks (consent, channel, removal). An operator or a member manages memory rather
        than using it: consent and channel do not apply to them, but a removed agent or member
        is served nothing, even before any wipe runs."""
        user = self._subject_user(ctx)
        if ctx.principal.role in ("agent", "helper"):
            return refusal(cfg, user, ctx.channel, state)
        if state.agent_removed or state.user_removed or state.tenant_removed:
            return refusal(cfg, user, None, state)
        return None

    async def _check_subject(self, ctx: Context, cfg: AgentConfig) -> None:
        refused(self._refusal(ctx, cfg, await self._state(ctx)))

    def _scopes(self, ctx: Context, cfg: AgentConfig) -> tuple[str, ...]:
        """The scopes `ctx` reads: an operator never reads a member's (USER) facts."""
        scopes = readable_scopes(cfg, ctx.session, ctx.user)
        return tuple(s for s in scopes if s != Scope.USER.value) if ctx.principal.role == "operator" else scopes

    async def subjects(self, ctx: Context) -> list[dict[str, Any]]:
        """For an operator: the agent's members, their live-fact counts and consent
        (`member_reads.subjects`)."""
        return await member_reads.subjects(self.records, ctx)

    # ------------------------------------------------------------------ blocks

    async def _shadowed(self, ctx: Context) -> set[str]:
        """A preview turn sees every record except the live ones a preview record replaces
        or deletes. (Ranked search filters on the index's own flag.)"""
        return await self.records.shadowed(ctx.tenant, ctx.agent) if ctx.preview else set()

    async def blocks(self, ctx: Context, application: str | None = None) -> list[tuple[str, str, str, str | None]]:
        """The blocks an agent's recall shows: (scope, label, text, application), the tenant's
        workspace-wide ones first, each scope by label; with `application`, that application's too."""
        check_role(ctx, NOT_MEMBER, "read an agent's blocks")
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        await self._check_subject(ctx, cfg)
        return await self._blocks(ctx, application)

    async def _blocks(self, ctx: Context, application: str | None = None) -> list[tuple[str, str, str, str | None]]:
        """(scope, label, text, application) in this order (docs/features/recall.md): the workspace's,
        the workspace's of `application`, the agent's, the agent's of `application`; each by label.
        Another application's never."""
        workspace, own = await asyncio.gather(self.records.blocks(ctx.tenant, WORKSPACE),
                                              self.records.blocks(ctx.tenant, ctx.agent))
        out: list[tuple[str, str, str, str | None]] = []
        for scope, stored in (("workspace", workspace), ("agent", own)):
            split = sorted(((*block_of_field(f), text) for f, text in stored.items()), key=lambda b: b[1])
            out += [(scope, label, text, None) for app, label, text in split if app is None]
            if application:
                out += [(scope, label, text, app) for app, label, text in split if app == application]
        return out

    # ------------------------------------------------------------------ search, recall, listing

    async def search(
        self,
        ctx: Context,
        query: str | None = None,
        kind: str | None = None,
        labels: dict[str, str] | None = None,
        ids: list[str] | None = None,
        limit: int | None = None,
        after: str | None = None,
        mode: str | None = None,
        min_score: float | None = None,
        dense: list[float] | None = None,
        cfg: AgentConfig | None = None,
        tags: list[str] | None = None,
    ) -> SearchResult:
        """`MemorySearch.search`: by ids, a listing without a query, otherwise ranked."""
        return await self._searching.search(ctx, query, kind, labels, ids, limit, after, mode, min_score, dense, cfg,
                                            tags)

    async def search_many(self, searches: list[tuple[Context, dict[str, Any]]],
                          named_times: bool = True) -> list[SearchResult | ApiError]:
        """`BatchSearch.search_many`: several searches, answered as `search` answers each."""
        return await self._batch.search_many(searches, named_times)

    async def recall(self, ctx: Context, conversation: str, text: str, run: str | None = None,
                     application: str | None = None, request: str | None = None) -> RecallResult:
        """`MemoryRecall.recall`: what the agent should remember before its next model call."""
        return await self._recalling.recall(ctx, conversation, text, run, application, request)

    async def memories(self, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
        """`MemoryListing.memories`: a page of the agent's records, as the caller may read them."""
        return await self._listing.memories(ctx, first, after, ascending)

    async def read(self, ctx: Context, rid: str, version: int | None = None) -> MemoryRecord:
        """`MemoryListing.read`: one record the caller may read, whatever its status."""
        return await self._listing.read(ctx, rid, version)

    async def history(self, ctx: Context, rid: str) -> list[MemoryRecord]:
        return await self._listing.history(ctx, rid)
