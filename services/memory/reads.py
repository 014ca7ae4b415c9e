"""Memory reads: search, recall, listing, reading a record and its history.

Reads come from the projections (Qdrant for ranking, Redis for records). Every rule that
protects one agent from another is applied here, on top of the filters the index applies.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from events.base import utcnow
from events.commands import WORKSPACE
from events.config import AgentConfig
from events.errors import ErrorCode
from events.record import MemoryRecord
from events.rules.ledger import RESERVED_KINDS
from events.rules.recall_render import fit, pinned_within_budget, render, render_fitted
from events.rules.visibility import readable_scopes, visible
from projections.qdrant_index import SearchFilter
from projections.records import CursorError, Page, encode_cursor, sort_score
from services.errors import ApiError
from services.memory.context import Context
from services.memory.recalled import RecalledVersions
from services.memory.rules import check_enabled
from services.memory.usage import UsageLog
from settings import Settings

if TYPE_CHECKING:
    from projections.embedding_port import Embedder
    from projections.redis_records import RedisRecords
    from workers.memory_shards import MemoryShards


@dataclass
class SearchResult:
    records: list[tuple[MemoryRecord, float | None]]
    next_cursor: str | None


@dataclass
class RecallResult:
    pinned: list[MemoryRecord]
    records: list[tuple[MemoryRecord, float | None]]
    rendered: str
    episodes: list[MemoryRecord]
    procedures: list[MemoryRecord]
    blocks: list[tuple[str, str, str]]  # (scope, label, text): the workspace's, then the agent's


RECALLED_PER_SECTION = 3  # episodes, and procedures, a recall offers at most
# Time spent embedding the query in this request, for the Server-Timing header.
EMBED_MS: contextvars.ContextVar[float] = contextvars.ContextVar("embed_ms", default=0.0)


@dataclass
class _Ranked:
    """One ranked search: what the index is asked, and how its hits become the answer."""

    ctx: Context
    scopes: tuple[str, ...]
    filter: SearchFilter
    query: str
    limit: int
    mode: str
    min_score: float
    dense: list[float] | None

    def run(self, index: MemoryShards) -> list[Any]:
        return index.search(self.filter, self.dense, self.query, self.limit, self.mode, self.min_score)

    def result(self, hits: list[Any], records: dict[str, MemoryRecord], now: Any) -> SearchResult:
        """The hits whose current record is in force and visible to the caller, best score
        first and newer records first among equals, cut to the limit."""
        kept = [(r, h.score) for h in hits if (r := records.get(h.record_id)) is not None
                and r.in_force(now) and visible(r, self.ctx, self.scopes)]
        kept.sort(key=lambda rs: (-round(rs[1], 9), -rs[0].created.timestamp()))
        return SearchResult(kept[:self.limit], None)


class MemoryReads:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None, embedder: Embedder,
                 usage: UsageLog, recalled: RecalledVersions | None = None) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory  # the shards of the current generation; swapped with it
        self.embedder = embedder
        self.usage = usage
        self.recalled = recalled or RecalledVersions(records)

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.records.config(tenant, agent) or AgentConfig()

    def _check_enabled(self, ctx: Context, cfg: AgentConfig) -> None:
        check_enabled(ctx, cfg, self.settings.memory_kill_switch)

    async def _shadowed(self, ctx: Context) -> set[str]:
        """A preview turn sees every record except the live ones a preview record replaces
        or deletes. (Ranked search filters on the index's own flag.)"""
        return await self.records.shadowed(ctx.tenant, ctx.agent) if ctx.preview else set()

    async def blocks(self, ctx: Context) -> list[tuple[str, str, str]]:
        """The blocks an agent's recall shows: (scope, label, text), the tenant's
        workspace-wide ones first, each scope by label."""
        self._check_enabled(ctx, await self.config(ctx.tenant, ctx.agent))
        return await self._blocks(ctx)

    async def _blocks(self, ctx: Context) -> list[tuple[str, str, str]]:
        workspace, own = await asyncio.gather(self.records.blocks(ctx.tenant, WORKSPACE),
                                              self.records.blocks(ctx.tenant, ctx.agent))
        return [("workspace", *b) for b in sorted(workspace.items())] + [("agent", *b) for b in sorted(own.items())]

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
    ) -> SearchResult:
        """`dense` and `cfg`: the query's vector and the agent's configuration, when the
        caller has them already (`search_many`)."""
        cfg = cfg or await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        limit = limit or cfg.memory.search.max_results
        scopes = readable_scopes(cfg, ctx.session)
        if ids:
            found = await self.records.get_many(ctx.tenant, ctx.agent, ids[:100])
            hidden = await self._shadowed(ctx)
            keep = [r for r in found if visible(r, ctx, scopes) and r.in_force(utcnow()) and r.id not in hidden]
            return SearchResult([(r, None) for r in keep], None)
        if not query:
            return await self._list(ctx, scopes, kind, labels or {}, limit, after)
        q = self._ranked(ctx, cfg, query, kind, labels, limit, mode, min_score, dense)
        if q.mode != "lexical" and q.dense is None:
            q.dense = await self._embed_query(ctx, query)
        hits = await asyncio.to_thread(q.run, self.memory)
        recs = await self.records.get_many(ctx.tenant, ctx.agent, [h.record_id for h in hits])
        return q.result(hits, {r.id: r for r in recs}, utcnow())

    def _ranked(self, ctx: Context, cfg: AgentConfig, query: str, kind: str | None, labels: dict[str, str] | None,
                limit: int | None, mode: str | None, min_score: float | None, dense: list[float] | None) -> _Ranked:
        """A ranked search's filter and settings, the agent's defaults filled in."""
        scopes = readable_scopes(cfg, ctx.session)
        f = SearchFilter(
            tenant=ctx.tenant,
            agent=ctx.agent,
            scopes=scopes,
            session=ctx.session,
            preview=ctx.preview,
            kind=kind,
            labels=tuple(sorted((labels or {}).items())),
        )
        mode = mode or cfg.memory.search.mode
        return _Ranked(
            ctx=ctx,
            scopes=scopes,
            filter=f,
            query=query,
            limit=limit or cfg.memory.search.max_results,
            mode=mode,
            min_score=cfg.memory.search.min_score if min_score is None else min_score,
            dense=None if mode == "lexical" else dense,
        )

    async def search_many(self, searches: list[tuple[Context, dict[str, Any]]]) -> list[SearchResult | ApiError]:
        """Several searches, each with its own context, as `search` would run them one by one.

        The queries that need a vector are embedded in one embedder call: one model request
        (or one ONNX batch) instead of one per query is what makes a batch cheap. A search
        that fails with an ApiError gets it in its place; the others still answer.
        """
        cfgs: dict[tuple[str, str], AgentConfig] = {}
        for ctx, _ in searches:
            if (ctx.tenant, ctx.agent) not in cfgs:
                cfgs[(ctx.tenant, ctx.agent)] = await self.config(ctx.tenant, ctx.agent)

        refused: dict[int, ApiError] = {}
        for i, (ctx, _) in enumerate(searches):
            try:
                self._check_enabled(ctx, cfgs[(ctx.tenant, ctx.agent)])
            except ApiError as e:
                refused[i] = e

        def needs_vector(ctx: Context, kw: dict[str, Any]) -> bool:
            mode = kw.get("mode") or cfgs[(ctx.tenant, ctx.agent)].memory.search.mode
            return bool(kw.get("query")) and not kw.get("ids") and mode != "lexical"

        todo = [i for i, (ctx, kw) in enumerate(searches) if i not in refused and needs_vector(ctx, kw)]
        vectors: dict[int, list[float]] = {}
        if todo:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            # Each distinct text once: short replies ("ok", "Noted.") repeat across sessions.
            texts = list(dict.fromkeys(searches[i][1]["query"] for i in todo))
            by_text = dict(zip(texts, await asyncio.to_thread(self.embedder.embed, texts)))
            ms = (loop.time() - t0) * 1000
            for i in todo:
                vectors[i] = by_text[searches[i][1]["query"]]
                ctx, kw = searches[i]
                # One usage record per query, as a single search records it.
                await self.usage.embedded(ctx, kw["query"], ms)

        # Ranked searches (a query, no ids) run together: the index searches in one worker
        # thread hop, and the records they hit in one Redis read per agent. One by one, a
        # batch of 32 cost 32 thread hops and 96 Redis round trips (and as many pooled
        # connections), more than the searches themselves.
        ranked: dict[int, _Ranked] = {}
        for i, (ctx, kw) in enumerate(searches):
            if i not in refused and kw.get("query") and not kw.get("ids"):
                args = {k: kw.get(k) for k in ("kind", "labels", "limit", "mode", "min_score")}
                ranked[i] = self._ranked(ctx, cfgs[(ctx.tenant, ctx.agent)], kw["query"], dense=vectors.get(i), **args)
        hits = await asyncio.to_thread(lambda: {i: q.run(self.memory) for i, q in ranked.items()})
        wanted: dict[tuple[str, str], dict[str, None]] = {}
        for i, q in ranked.items():
            wanted.setdefault((q.ctx.tenant, q.ctx.agent), {}).update(dict.fromkeys(h.record_id for h in hits[i]))
        found: dict[tuple[str, str], dict[str, MemoryRecord]] = {}
        for (tenant, agent), rids in wanted.items():
            found[(tenant, agent)] = {r.id: r for r in await self.records.get_many(tenant, agent, list(rids))}
        now = utcnow()

        async def one(i: int) -> SearchResult | ApiError:
            ctx, kw = searches[i]
            if i in refused:
                return refused[i]
            if i in ranked:
                return ranked[i].result(hits[i], found[(ctx.tenant, ctx.agent)], now)
            try:
                return await self.search(ctx, **kw, dense=vectors.get(i), cfg=cfgs[(ctx.tenant, ctx.agent)])
            except ApiError as e:
                return e
            except CursorError as e:
                return ApiError(ErrorCode.VALIDATION_FAILED, "after", f"after: {e}", 422)

        return list(await asyncio.gather(*(one(i) for i in range(len(searches)))))

    async def _embed_query(self, ctx: Context, query: str) -> list[float]:
        t0 = asyncio.get_running_loop().time()
        vec = (await asyncio.to_thread(self.embedder.embed, [query]))[0]
        EMBED_MS.set((asyncio.get_running_loop().time() - t0) * 1000)
        await self.usage.embedded(ctx, query, (asyncio.get_running_loop().time() - t0) * 1000)
        return vec

    async def recall(self, ctx: Context, conversation: str, text: str) -> RecallResult:
        """What the agent should remember before its next model call."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        if not cfg.memory.enabled or self.settings.memory_kill_switch:
            return RecallResult([], [], render([], []), [], [], [])
        scopes, now = readable_scopes(cfg, ctx.session), utcnow()
        hidden = await self._shadowed(ctx)
        pinned_all = [
            r for r in await self.records.pinned(ctx.tenant, ctx.agent)
            if r.in_force(now) and visible(r, ctx, scopes) and r.id not in hidden
        ]
        pinned = pinned_within_budget(pinned_all, cfg.memory.pinned.max_tokens if cfg.memory.pinned else None)
        # Episodes and procedures come from the same ranked search, in sections of their own
        # (why, and the figures: docs/recall-sections.md).
        found = await self.search(ctx, query=text, limit=cfg.memory.search.max_results * 2, cfg=cfg)
        pinned_ids = {r.id for r in pinned}
        fresh = [(r, s) for r, s in found.records if r.id not in pinned_ids]
        if fresh:
            seen = await self.recalled.shown(ctx.tenant, ctx.agent, conversation, [r for r, _ in fresh])
            fresh = [x for x, was in zip(fresh, seen) if not was]
        blocks = await self._blocks(ctx)
        shown_blocks = [(label if scope == "agent" else f"{label} (workspace)", text) for scope, label, text in blocks]
        fitted = fit(
            pinned,
            [r for r, _ in fresh if r.kind not in RESERVED_KINDS][: cfg.memory.search.max_results],
            shown_blocks,
            [r for r, _ in fresh if r.kind == "episode"][:RECALLED_PER_SECTION],
            [r for r, _ in fresh if r.kind == "procedure"][:RECALLED_PER_SECTION],
        )
        records, episodes, procedures = fitted.records, fitted.episodes, fitted.procedures
        shown = records + episodes + procedures
        if shown:
            await self.recalled.mark(ctx.tenant, ctx.agent, conversation, shown)
            await self.usage.retrieved(ctx, "recall", shown, conversation)
        scores = dict((r.id, s) for r, s in fresh)
        return RecallResult(fitted.pinned, [(r, scores[r.id]) for r in records], render_fitted(fitted), episodes,
                            procedures, blocks)

    async def _list(self, ctx, scopes, kind, labels, limit, after) -> SearchResult:
        now = utcnow()
        hidden = await self._shadowed(ctx)

        def wanted(r: MemoryRecord) -> bool:
            return (
                r.in_force(now)
                and r.id not in hidden
                and visible(r, ctx, scopes)
                and (not kind or r.kind == kind)
                and all(r.labels.get(k) == v for k, v in labels.items())
            )

        out: list[MemoryRecord] = []
        cursor = after
        while len(out) <= limit:
            page = await self.records.page(ctx.tenant, ctx.agent, limit * 2, cursor)
            out.extend(r for r in page.records if wanted(r))
            cursor = page.next_cursor
            if not cursor:
                break
        more, out = len(out) > limit, out[:limit]
        nxt = encode_cursor(sort_score(out[-1]), out[-1].id) if more else None
        return SearchResult([(r, None) for r in out], nxt)

    async def memories(self, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
        """A page of the agent's listed records by creation time. An operator sees every
        session's and preview records; an agent what it may read."""
        self._check_enabled(ctx, await self.config(ctx.tenant, ctx.agent))
        page = await self.records.page(ctx.tenant, ctx.agent, first, after, ascending=ascending)
        if ctx.principal.role == "operator":
            return page
        hidden = await self._shadowed(ctx)
        return Page([r for r in page.records if visible(r, ctx) and r.id not in hidden], page.next_cursor)

    async def read(self, ctx: Context, rid: str, version: int | None = None) -> MemoryRecord:
        """For an operator: any of the agent's records, whatever its session or mode. For an
        agent (`read_memory`): a record it may read, whatever its status."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        operator = ctx.principal.role == "operator"
        if not operator and "read_memory" not in cfg.memory.tools:
            raise ApiError(ErrorCode.TOOL_NOT_ALLOWED, "tool", f"read_memory is not in memory.tools "
                           f"{cfg.memory.tools}; search_memory with ids reads current records")
        r = await self.records.get(ctx.tenant, ctx.agent, rid, version)
        if r is None or not (operator or visible(r, ctx)):
            raise ApiError(ErrorCode.NOT_FOUND, "id", f"no record {rid} for this agent")
        return r

    async def history(self, ctx: Context, rid: str) -> list[MemoryRecord]:
        await self.read(ctx, rid)
        return await self.records.history(ctx.tenant, ctx.agent, rid)
