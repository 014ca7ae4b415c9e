"""Memory search: records by id, a listing when there is no query, otherwise a ranked search
through the index; and the query's embedding."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from events.config import AgentConfig
from events.record import MemoryRecord, Scope
from events.rules import named_time
from projections.qdrant.index import Mode, SearchFilter
from projections.records import encode_cursor, sort_score
from services.memory.context import Context
from services.memory.rules import NOT_MEMBER, check_role, shown_to
from workers.runtime.metrics import SEARCH_SECONDS, Timed

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords
    from services.memory.fair_embedding import FairEmbedding
    from services.memory.usage import UsageLog
    from workers.followers.memory_shards import MemoryShards


@dataclass
class SearchResult:
    records: list[tuple[MemoryRecord, float | None]]
    next_cursor: str | None


# Time spent embedding the query in this request, for the Server-Timing header.
EMBED_MS: contextvars.ContextVar[float] = contextvars.ContextVar("embed_ms", default=0.0)


@dataclass
class Ranked:
    """One ranked search: what the index is asked, and how its hits become the answer."""

    ctx: Context
    scopes: tuple[str, ...]
    filter: SearchFilter
    query: str
    limit: int
    mode: str
    min_score: float
    dense: list[float] | None
    window: tuple[int, int] | None = None  # the time the query names (Unix ms): hybrid ranks it first

    def run(self, index: MemoryShards) -> list[Any]:
        # The API validated the mode (or the agent's configuration gave it): one of the index's.
        return index.search(self.filter, self.dense, self.query, self.limit, cast(Mode, self.mode), self.min_score,
                            self.window)

    def result(self, hits: list[Any], records: dict[str, MemoryRecord], now: Any) -> SearchResult:
        """The hits whose current record is in force and visible to the caller, best score
        first and newer records first among equals, cut to the limit."""
        kept = [(r, h.score) for h in hits if (r := records.get(h.record_id)) is not None
                and r.in_force(now) and shown_to(self.ctx, r, self.scopes)]
        kept.sort(key=lambda rs: (-round(rs[1], 9), -rs[0].created.timestamp()))
        return SearchResult(kept[:self.limit], None)


class SearchReads(Protocol):
    """What a search reads of the memory reads: the record view, the index, the query's
    embedder, the usage log and the checks every read makes."""

    records: RedisRecords
    memory: MemoryShards | None
    fair: FairEmbedding
    usage: UsageLog

    async def config(self, tenant: str, agent: str) -> AgentConfig: ...

    def now(self) -> datetime: ...

    def _check_enabled(self, ctx: Context, cfg: AgentConfig) -> None: ...

    async def _check_subject(self, ctx: Context, cfg: AgentConfig) -> None: ...

    def _scopes(self, ctx: Context, cfg: AgentConfig) -> tuple[str, ...]: ...

    async def _shadowed(self, ctx: Context) -> set[str]: ...


class MemorySearch:
    def __init__(self, reads: SearchReads) -> None:
        self.reads = reads

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
        """`dense` and `cfg`: the query's vector and the agent's configuration, when the
        caller has them already (`search_many`). `tags`: records holding every one of them."""
        check_role(ctx, NOT_MEMBER, "search memory")
        with Timed(SEARCH_SECONDS):
            cfg = cfg or await self.reads.config(ctx.tenant, ctx.agent)
            self.reads._check_enabled(ctx, cfg)
            await self.reads._check_subject(ctx, cfg)
            return await self.checked(ctx, cfg, query, kind, labels, ids, limit, after, mode, min_score, dense, tags)

    async def checked(self, ctx: Context, cfg: AgentConfig, query: str | None = None, kind: str | None = None,
                      labels: dict[str, str] | None = None, ids: list[str] | None = None, limit: int | None = None,
                      after: str | None = None, mode: str | None = None, min_score: float | None = None,
                      dense: list[float] | None = None, tags: list[str] | None = None) -> SearchResult:
        """A search whose caller was checked (role, memory on, subject)."""
        limit = limit or cfg.memory.search.max_results
        scopes = self.reads._scopes(ctx, cfg)
        if ids:
            found = await self.reads.records.get_many(ctx.tenant, ctx.agent, ids[:100])
            hidden = await self.reads._shadowed(ctx)
            keep = [r for r in found if shown_to(ctx, r, scopes) and r.in_force(self.reads.now()) and r.id not in hidden]
            return SearchResult([(r, None) for r in keep], None)
        if not query:
            return await self.listed(ctx, scopes, kind, labels or {}, limit, after, tags or ())
        q = self.ranked(ctx, cfg, query, kind, labels, limit, mode, min_score, dense, tags=tuple(tags or ()))
        if q.mode != "lexical" and q.dense is None:
            q.dense = await self.embed_query(ctx, query)
        return (await self.run(ctx, [q]))[0]

    async def listed(self, ctx, scopes, kind, labels, limit, after, tags=()) -> SearchResult:
        """A search without a query: the records `ctx` may read in `scopes`, as filtered, a page
        of `limit` from the cursor `after`."""
        now = self.reads.now()
        hidden = await self.reads._shadowed(ctx)

        def wanted(r: MemoryRecord) -> bool:
            return (
                r.in_force(now)
                and r.id not in hidden
                and shown_to(ctx, r, scopes)
                and (not kind or r.kind == kind)
                and all(r.labels.get(k) == v for k, v in labels.items())
                and all(t in r.tags for t in tags)
            )

        # A caller who reads only its member's facts pages through that member's own listing, not
        # through every member's records of the agent.
        member = ctx.user if tuple(scopes) == (Scope.USER.value,) else None
        out: list[MemoryRecord] = []
        cursor = after
        while len(out) <= limit:
            page = await self.reads.records.page(ctx.tenant, ctx.agent, limit * 2, cursor, user=member)
            out.extend(r for r in page.records if wanted(r))
            cursor = page.next_cursor
            if not cursor:
                break
        more, out = len(out) > limit, out[:limit]
        nxt = encode_cursor(sort_score(out[-1]), out[-1].id) if more else None
        return SearchResult([(r, None) for r in out], nxt)

    async def run(self, ctx: Context, queries: list[Ranked]) -> list[SearchResult]:
        """Ranked searches of one agent, in one thread, and one read of the records they found."""
        # A cast, not an assert: a service built without shards fails here as it always did.
        hits = await asyncio.to_thread(lambda: [q.run(cast("MemoryShards", self.reads.memory)) for q in queries])
        recs = await self.reads.records.get_many(ctx.tenant, ctx.agent, [h.record_id for part in hits for h in part])
        by_id, now = {r.id: r for r in recs}, self.reads.now()
        return [q.result(part, by_id, now) for q, part in zip(queries, hits, strict=True)]

    def ranked(self, ctx: Context, cfg: AgentConfig, query: str, kind: str | None, labels: dict[str, str] | None,
               limit: int | None, mode: str | None, min_score: float | None, dense: list[float] | None,
               kinds: tuple[str, ...] = (), not_kinds: tuple[str, ...] = (), tags: tuple[str, ...] = (),
               named_times: bool = True) -> Ranked:
        """A ranked search's filter and settings, the agent's defaults filled in. `named_times`
        False: a time the query names ranks nothing first (a lookup by a fact, not a question)."""
        scopes = self.reads._scopes(ctx, cfg)
        f = SearchFilter(
            tenant=ctx.tenant,
            agent=ctx.agent,
            scopes=scopes,
            session=ctx.session,
            preview=ctx.preview,
            kind=kind,
            labels=tuple(sorted((labels or {}).items())),
            user=ctx.user if Scope.USER.value in scopes else None,
            kinds=kinds,
            not_kinds=not_kinds,
            tags=tags,
        )
        mode = mode or cfg.memory.search.mode
        # "What did we decide last week?": read against the reads' clock (an as_of search's point).
        named = named_time.window(query, self.reads.now()) if mode == "hybrid" and named_times else None
        return Ranked(
            ctx=ctx,
            scopes=scopes,
            filter=f,
            query=query,
            limit=limit or cfg.memory.search.max_results,
            mode=mode,
            min_score=cfg.memory.search.min_score if min_score is None else min_score,
            dense=None if mode == "lexical" else dense,
            window=None if named is None else named.ms(),
        )

    async def embed_query(self, ctx: Context, query: str) -> list[float]:
        t0 = asyncio.get_running_loop().time()
        vec = (await self.reads.fair.embed(ctx.tenant, [query]))[0]
        EMBED_MS.set((asyncio.get_running_loop().time() - t0) * 1000)
        await self.reads.usage.embedded(ctx, query, (asyncio.get_running_loop().time() - t0) * 1000)
        return vec
