"""Memory reads: search, recall, listing, reading a record and its history.

Reads come from the projections (Qdrant for ranking, Redis for records). Every rule that
protects one agent from another is applied here, on top of the filters the index applies.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from events.base import utcnow
from events.commands import WORKSPACE, block_of_field
from events.config import AgentConfig
from events.errors import ErrorCode
from events.record import MemoryRecord, Scope
from events.rules.ledger import LIVE_FACT_CAP, RESERVED_KINDS
from events.rules.procedures import is_anti_pattern
from events.rules.procedures import rank as procedures_rank
from events.rules.recall_render import Entry, fit, fit_facts, pinned_within_budget, render, render_fitted
from events.rules.subjects import Refusal, SubjectState, refusal
from events.rules.visibility import readable_scopes, visible
from projections.qdrant_index import IndexUnavailable, Mode, SearchFilter
from projections.records import CursorError, Page, encode_cursor, sort_score
from projections.redis_runs import RunView
from services.errors import ApiError
from services.memory import member_reads
from services.memory.context import Context
from services.memory.fair_embedding import FairEmbedding
from services.memory.ports import LayerSource, RecallAsk
from services.memory.recalled import OTHER, SAME, RecalledVersions
from services.memory.rules import NOT_MEMBER, check_enabled, check_role, readable_by, refused, shown_to
from services.memory.usage import UsageLog
from settings import Settings
from workers.runtime.metrics import RECALL_SECONDS, SEARCH_SECONDS, Timed

if TYPE_CHECKING:
    from projections.embedding_port import Embedder
    from projections.redis_records import RedisRecords
    from workers.followers.memory_shards import MemoryShards


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
    # (scope, label, text, application): the workspace's, then the agent's (`MemoryReads._blocks`)
    blocks: list[tuple[str, str, str, str | None]]
    # Why the subject got no memory (consent, channel, removal): the recall is empty, and the
    # platform's turn goes on without memory.
    skipped: Refusal | None = None
    # Memory could not be read (Redis or the index failed): empty, logged, and the turn goes on.
    memory_unavailable: bool = False
    # The run's session memory (its summary and newest entries) and the procedures to avoid.
    session_summary: str | None = None
    session_entries: list[Any] = field(default_factory=list)
    avoid: list[MemoryRecord] = field(default_factory=list)
    # The shared layers' entries the block shows (policies, floors, profile, notes,
    # conventions, defaults), by layer heading.
    shared: dict[str, list[Entry]] = field(default_factory=dict)


log = structlog.get_logger()
RECALLED_PER_SECTION = 3  # episodes, and procedures, a recall offers at most
# What a recall treats as memory being unreadable: Redis down or timing out, a socket
# error, the index (Qdrant Edge or a Qdrant server) failing.
READ_FAILURES = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError, IndexUnavailable)


def _block_title(scope: str, label: str, application: str | None) -> str:
    """A block's heading in the rendered recall: its label, and where it comes from when not the agent's own."""
    where = ", ".join(w for w in ("workspace" if scope == "workspace" else "", application or "") if w)
    return f"{label} ({where})" if where else label


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
        # The API validated the mode (or the agent's configuration gave it): one of the index's.
        return index.search(self.filter, self.dense, self.query, self.limit, cast(Mode, self.mode), self.min_score)

    def result(self, hits: list[Any], records: dict[str, MemoryRecord], now: Any) -> SearchResult:
        """The hits whose current record is in force and visible to the caller, best score
        first and newer records first among equals, cut to the limit."""
        kept = [(r, h.score) for h in hits if (r := records.get(h.record_id)) is not None
                and r.in_force(now) and shown_to(self.ctx, r, self.scopes)]
        kept.sort(key=lambda rs: (-round(rs[1], 9), -rs[0].created.timestamp()))
        return SearchResult(kept[:self.limit], None)


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
        self.recalled = recalled or RecalledVersions(records)
        # Recall's shared layers (profiles, notes, tenant and platform memory): each source
        # is read beside the search (`RecallAsk` in, entries by layer heading out).
        self.layer_sources: list[LayerSource] = []

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

    # ------------------------------------------------------------------ search

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
            cfg = cfg or await self.config(ctx.tenant, ctx.agent)
            self._check_enabled(ctx, cfg)
            await self._check_subject(ctx, cfg)
            return await self._search(ctx, cfg, query, kind, labels, ids, limit, after, mode, min_score, dense, tags)

    async def _search(self, ctx: Context, cfg: AgentConfig, query: str | None = None, kind: str | None = None,
                      labels: dict[str, str] | None = None, ids: list[str] | None = None, limit: int | None = None,
                      after: str | None = None, mode: str | None = None, min_score: float | None = None,
                      dense: list[float] | None = None, tags: list[str] | None = None) -> SearchResult:
        """A search whose caller was checked (role, memory on, subject)."""
        limit = limit or cfg.memory.search.max_results
        scopes = self._scopes(ctx, cfg)
        if ids:
            found = await self.records.get_many(ctx.tenant, ctx.agent, ids[:100])
            hidden = await self._shadowed(ctx)
            keep = [r for r in found if shown_to(ctx, r, scopes) and r.in_force(utcnow()) and r.id not in hidden]
            return SearchResult([(r, None) for r in keep], None)
        if not query:
            return await self._list(ctx, scopes, kind, labels or {}, limit, after, tags or ())
        q = self._ranked(ctx, cfg, query, kind, labels, limit, mode, min_score, dense, tags=tuple(tags or ()))
        if q.mode != "lexical" and q.dense is None:
            q.dense = await self._embed_query(ctx, query)
        return (await self._run(ctx, [q]))[0]

    async def _run(self, ctx: Context, queries: list[_Ranked]) -> list[SearchResult]:
        """Ranked searches of one agent, in one thread, and one read of the records they found."""
        # A cast, not an assert: a service built without shards fails here as it always did.
        hits = await asyncio.to_thread(lambda: [q.run(cast("MemoryShards", self.memory)) for q in queries])
        recs = await self.records.get_many(ctx.tenant, ctx.agent, [h.record_id for part in hits for h in part])
        by_id, now = {r.id: r for r in recs}, utcnow()
        return [q.result(part, by_id, now) for q, part in zip(queries, hits, strict=True)]

    def _ranked(self, ctx: Context, cfg: AgentConfig, query: str, kind: str | None, labels: dict[str, str] | None,
                limit: int | None, mode: str | None, min_score: float | None, dense: list[float] | None,
                kinds: tuple[str, ...] = (), not_kinds: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> _Ranked:
        """A ranked search's filter and settings, the agent's defaults filled in."""
        scopes = self._scopes(ctx, cfg)
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
        that fails with an ApiError gets it in its place; the others still answer. Each
        search's subject (its context's member) is checked on its own.
        """
        cfgs: dict[tuple[str, str], AgentConfig] = {}
        for ctx, _ in searches:
            if (ctx.tenant, ctx.agent) not in cfgs:
                cfgs[(ctx.tenant, ctx.agent)] = await self.config(ctx.tenant, ctx.agent)
        # Each subject's state once, read together: a batch is often one agent's many members.
        firsts = {(ctx.tenant, ctx.agent, self._subject_user(ctx)): ctx for ctx, _ in searches}
        states: dict[tuple[str, str, str | None], SubjectState] = dict(
            zip(firsts, await asyncio.gather(*(self._state(ctx) for ctx in firsts.values()))))

        refused_at: dict[int, ApiError] = {}
        for i, (ctx, _) in enumerate(searches):
            cfg = cfgs[(ctx.tenant, ctx.agent)]
            try:
                check_role(ctx, NOT_MEMBER, "search memory")
                self._check_enabled(ctx, cfg)
                refused(self._refusal(ctx, cfg, states[(ctx.tenant, ctx.agent, self._subject_user(ctx))]))
            except ApiError as e:
                refused_at[i] = e

        def needs_vector(ctx: Context, kw: dict[str, Any]) -> bool:
            mode = kw.get("mode") or cfgs[(ctx.tenant, ctx.agent)].memory.search.mode
            return bool(kw.get("query")) and not kw.get("ids") and mode != "lexical"

        todo = [i for i, (ctx, kw) in enumerate(searches) if i not in refused_at and needs_vector(ctx, kw)]
        vectors: dict[int, list[float]] = {}
        if todo:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            # Each distinct text of a tenant once: short replies ("ok", "Noted.") repeat across
            # sessions. Each tenant's texts wait in its own queue: one refused (429) refuses its items.
            per_tenant: dict[str, list[str]] = {}
            for i in todo:
                per_tenant.setdefault(searches[i][0].tenant, []).append(searches[i][1]["query"])
            tenants = list(per_tenant)
            texts = {t: list(dict.fromkeys(qs)) for t, qs in per_tenant.items()}
            answers = await asyncio.gather(*(self.fair.embed(t, texts[t]) for t in tenants), return_exceptions=True)
            by_text: dict[tuple[str, str], list[float]] = {}
            for t, got in zip(tenants, answers, strict=True):
                if isinstance(got, ApiError):
                    refused_at.update({i: got for i in todo if searches[i][0].tenant == t})
                elif isinstance(got, BaseException):
                    raise got
                else:
                    by_text.update({(t, q): v for q, v in zip(texts[t], got, strict=True)})
            ms = (loop.time() - t0) * 1000
            for i in todo:
                if i in refused_at:
                    continue
                ctx, kw = searches[i]
                vectors[i] = by_text[(ctx.tenant, kw["query"])]
                # One usage record per query, as a single search records it.
                await self.usage.embedded(ctx, kw["query"], ms)

        # Ranked searches (a query, no ids) run together: the index searches in one worker
        # thread hop, and the records they hit in one Redis read per agent. One by one, a
        # batch of 32 cost 32 thread hops and 96 Redis round trips (and as many pooled
        # connections), more than the searches themselves.
        ranked: dict[int, _Ranked] = {}
        for i, (ctx, kw) in enumerate(searches):
            if i not in refused_at and kw.get("query") and not kw.get("ids"):
                args: dict[str, Any] = {k: kw.get(k) for k in ("kind", "labels", "limit", "mode", "min_score")}
                args["tags"] = tuple(kw.get("tags") or ())
                ranked[i] = self._ranked(ctx, cfgs[(ctx.tenant, ctx.agent)], kw["query"], dense=vectors.get(i), **args)
        hits = await asyncio.to_thread(lambda: {i: q.run(cast("MemoryShards", self.memory)) for i, q in ranked.items()})
        wanted: dict[tuple[str, str], dict[str, None]] = {}
        for i, q in ranked.items():
            wanted.setdefault((q.ctx.tenant, q.ctx.agent), {}).update(dict.fromkeys(h.record_id for h in hits[i]))
        found: dict[tuple[str, str], dict[str, MemoryRecord]] = {}
        for (tenant, agent), rids in wanted.items():
            found[(tenant, agent)] = {r.id: r for r in await self.records.get_many(tenant, agent, list(rids))}
        now = utcnow()

        async def one(i: int) -> SearchResult | ApiError:
            ctx, kw = searches[i]
            if i in refused_at:
                return refused_at[i]
            if i in ranked:
                return ranked[i].result(hits[i], found[(ctx.tenant, ctx.agent)], now)
            try:
                return await self._search(ctx, cfgs[(ctx.tenant, ctx.agent)], **kw, dense=vectors.get(i))
            except ApiError as e:
                return e
            except CursorError as e:
                return ApiError(ErrorCode.VALIDATION_FAILED, "after", f"after: {e}", 422)

        return list(await asyncio.gather(*(one(i) for i in range(len(searches)))))

    async def _embed_query(self, ctx: Context, query: str) -> list[float]:
        t0 = asyncio.get_running_loop().time()
        vec = (await self.fair.embed(ctx.tenant, [query]))[0]
        EMBED_MS.set((asyncio.get_running_loop().time() - t0) * 1000)
        await self.usage.embedded(ctx, query, (asyncio.get_running_loop().time() - t0) * 1000)
        return vec

    # ------------------------------------------------------------------ recall

    @staticmethod
    def _empty(cfg: AgentConfig | None, skipped: Refusal | None = None, unavailable: bool = False) -> RecallResult:
        """An empty recall: seed 004's facts format appends nothing, memlane's block is empty."""
        rendered = "" if cfg is not None and cfg.memory.recall.format == "facts" else render([], [])
        return RecallResult([], [], rendered, [], [], [], skipped=skipped, memory_unavailable=unavailable)

    async def recall(self, ctx: Context, conversation: str, text: str, run: str | None = None,
                     application: str | None = None, request: str | None = None) -> RecallResult:
        """What the agent should remember before its next model call.

        Never fails the platform's turn for memory's sake: a subject that gets no memory
        (consent, channel, removal) gets an empty recall naming why (`skipped`), and memory
        that cannot be read (Redis or the index down) an empty one with `memory_unavailable`,
        logged without the caller's text or member. `request` names the attempt: sent again, it
        is shown what its first attempt showed."""
        check_role(ctx, NOT_MEMBER, "recall memory")
        with Timed(RECALL_SECONDS):
            return await self._recall_or_empty(ctx, conversation, text, run, application, request)

    async def _recall_or_empty(self, ctx: Context, conversation: str, text: str, run: str | None,
                               application: str | None, request: str | None) -> RecallResult:
        cfg: AgentConfig | None = None
        try:
            got_cfg, state = await asyncio.gather(self.config(ctx.tenant, ctx.agent), self._state(ctx),
                                                  return_exceptions=True)
            for got in (got_cfg, state):
                if isinstance(got, BaseException):
                    raise got
            cfg = cast(AgentConfig, got_cfg)  # the loop above raised any exception
            if not cfg.memory.enabled or self.settings.memory_kill_switch:
                return self._empty(cfg)
            skipped = self._refusal(ctx, cfg, cast(SubjectState, state))
            if skipped is not None:
                return self._empty(cfg, skipped=skipped)
            return await self._recall(ctx, cfg, conversation, text, run, application, request)
        except READ_FAILURES as e:
            log.warning("recall_memory_unavailable", tenant=ctx.tenant, agent=ctx.agent, error=type(e).__name__)
            return self._empty(cfg, unavailable=True)

    async def _recall(self, ctx: Context, cfg: AgentConfig, conversation: str, text: str,
                      run: str | None = None, application: str | None = None,
                      request: str | None = None) -> RecallResult:
        scopes, now = self._scopes(ctx, cfg), utcnow()
        # Every read that does not depend on the search runs while it runs, each one Redis call
        # or two: pins, blocks, the run's session memory and the shared layers. The search
        # stays in this task: its embedding time is the request's (Server-Timing).
        ask = RecallAsk(ctx, cfg, text, conversation, run, application)
        aside = (asyncio.ensure_future(self._shadowed(ctx)),
                 asyncio.ensure_future(self.records.pinned(ctx.tenant, ctx.agent)),
                 asyncio.ensure_future(self._blocks(ctx, application)),
                 asyncio.ensure_future(self._session(ctx, run, now, cfg)),
                 asyncio.ensure_future(self._shared_layers(ask)))
        try:
            found = await self._recall_search(ctx, cfg, text)
            hidden, pinned_all, blocks, (summary, entries), shared = await asyncio.gather(*aside)
        except BaseException:
            for f in aside:
                f.cancel()
            raise
        pinned_all = [r for r in pinned_all if r.in_force(now) and shown_to(ctx, r, scopes) and r.id not in hidden]
        pinned = pinned_within_budget(pinned_all, cfg.memory.pinned.max_tokens if cfg.memory.pinned else None)
        # Episodes and procedures come from the same ranked search, in sections of their own
        # (why, and the figures: docs/decisions/0010-recall-sections-from-one-search.md).
        pinned_ids = {r.id for r in pinned}
        fresh = [(r, s) for r, s in found.records if r.id not in pinned_ids]
        # Versions this conversation's recalls showed before are never recorded again;
        # `memory.recall.recalled` says whether they are shown again ("render", seed 004)
        # or left out ("omit").
        again: set[str] = set()
        retried: set[str] = set()  # shown by this same request's earlier attempt: shown, not counted again
        if fresh:
            seen = await self.recalled.shown(ctx.tenant, ctx.agent, conversation, [r for r, _ in fresh], request)
            again = {r.id for (r, _), by in zip(fresh, seen) if by == OTHER}
            retried = {r.id for (r, _), by in zip(fresh, seen) if by == SAME}
            if cfg.memory.recall.recalled == "omit":
                fresh = [x for x in fresh if x[0].id not in again]
        facts = [r for r, _ in fresh if r.kind not in RESERVED_KINDS]
        if cfg.memory.recall.format == "facts":
            # The facts block: pins and every live fact, one line each, the most relevant first,
            # a fact that does not fit the block's 8,000 characters left out whole; no blocks,
            # episodes or procedures.
            kept, rendered = fit_facts(pinned + facts)
            kept_ids = {r.id for r in kept}
            shown_pins = [r for r in pinned if r.id in kept_ids]
            records, episodes, procedures, avoid = [r for r in facts if r.id in kept_ids], [], [], []
            shared = {}
        else:
            facts = facts[: cfg.memory.search.max_results]
            shown = {r.id for r in facts}
            entries = [e for e in entries if e.record_id not in shown]  # a fact the recall shows already
            shown_blocks = [(_block_title(scope, label, app), text) for scope, label, text, app in blocks]
            # Reported outcomes reorder procedures; anti-patterns get a layer of their own.
            procs = procedures_rank([r for r, _ in fresh if r.kind == "procedure"], {r.id: s for r, s in fresh})
            fitted = fit(
                pinned,
                facts,
                shown_blocks,
                [r for r, _ in fresh if r.kind == "episode"][:RECALLED_PER_SECTION],
                [r for r in procs if not is_anti_pattern(r)][:RECALLED_PER_SECTION],
                avoid=[r for r in procs if is_anti_pattern(r)][:RECALLED_PER_SECTION],
                session_summary=summary,
                session_entries=entries,
                shared=shared,
            )
            summary, entries, shared = fitted.session_summary, fitted.session_entries, fitted.shared
            rendered, shown_pins = render_fitted(fitted), fitted.pinned
            records, episodes, procedures, avoid = fitted.records, fitted.episodes, fitted.procedures, fitted.avoid
        await self.usage.pinned(ctx, shown_pins, conversation)
        new = [r for r in records + episodes + procedures + avoid if r.id not in again and r.id not in retried]
        if new:
            await self.recalled.mark(ctx.tenant, ctx.agent, conversation, new, request)
            await self.usage.retrieved(ctx, "recall", new, conversation)
        scores = dict((r.id, s) for r, s in fresh)
        return RecallResult(shown_pins, [(r, scores[r.id]) for r in records], rendered, episodes, procedures, blocks,
                            session_summary=summary, session_entries=entries, avoid=avoid, shared=shared)

    async def _recall_search(self, ctx: Context, cfg: AgentConfig, text: str) -> SearchResult:
        """Recall's ranked search, in two parts run together: facts (every kind but episodes and
        procedures) and those two kinds, which seed 004's facts format leaves out. In one list,
        hundreds of episodes that match a query word for word take every place ahead of a fact
        found by meaning: the fused score ranks them so (docs/decisions/0010-recall-sections-from-one-search.md)."""
        every = cfg.memory.recall.format == "facts"  # the facts block shows every live fact
        limit = LIVE_FACT_CAP if every else cfg.memory.search.max_results * 2
        if not text.strip():
            return await self._search(ctx, cfg, query=text, limit=limit)
        dense = None if cfg.memory.search.mode == "lexical" else await self._embed_query(ctx, text)
        parts = [{"not_kinds": RESERVED_KINDS}]
        if not every:
            parts.append({"kinds": RESERVED_KINDS})
        found = await self._run(ctx, [self._ranked(ctx, cfg, text, None, None, limit, None, None, dense, **kinds)
                                      for kinds in parts])
        ranked = [x for part in found for x in part.records]
        if every:  # then the facts no search ranked, newest first
            seen = {r.id for r, _ in ranked}
            listed = await self._search(ctx, cfg, query=None, limit=limit)
            ranked += [(r, None) for r, _ in listed.records if r.id not in seen and r.kind not in RESERVED_KINDS]
        return SearchResult(ranked, None)

    async def _shared_layers(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """Every layer source's entries, by layer heading; seed 004's facts format has none."""
        if not self.layer_sources or ask.cfg.memory.recall.format == "facts":
            return {}
        out: dict[str, list[Entry]] = {}
        for got in await asyncio.gather(*(source(ask) for source in self.layer_sources)):
            for heading, entries in got.items():
                out.setdefault(heading, []).extend(entries)
        return out

    async def _session(self, ctx: Context, run: str | None, now: Any, cfg: AgentConfig) -> tuple[str | None, list]:
        """The run's summary and its entries, newest first: what fits of a long run is its latest.
        Seed 004's facts format has no session layers, and an operator gets no member's."""
        if run is None or cfg.memory.recall.format == "facts":
            return None, []
        if ctx.principal.role == "operator" and ctx.user is not None:
            return None, []  # a member's session memory is never an operator's to read
        entries, summary = await RunView(self.records).session(ctx.tenant, ctx.agent, run, now, ctx.user)
        return summary, entries[::-1]

    # ------------------------------------------------------------------ listing and reading

    async def _list(self, ctx, scopes, kind, labels, limit, after, tags=()) -> SearchResult:
        now = utcnow()
        hidden = await self._shadowed(ctx)

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
            page = await self.records.page(ctx.tenant, ctx.agent, limit * 2, cursor, user=member)
            out.extend(r for r in page.records if wanted(r))
            cursor = page.next_cursor
            if not cursor:
                break
        more, out = len(out) > limit, out[:limit]
        nxt = encode_cursor(sort_score(out[-1]), out[-1].id) if more else None
        return SearchResult([(r, None) for r in out], nxt)

    async def memories(self, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
        """A page of the agent's listed records by creation time. An operator sees every
        session's and preview records but no member's facts; a member their own live facts
        (pending and conflicting ones too), at most `member_reads.MEMBER_LIST` a page; an agent what it may read."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        await self._check_subject(ctx, cfg)
        role = ctx.principal.role
        if role == "operator":
            return await member_reads.operator_page(self.records, ctx, first, after, ascending)
        if role == "member":
            return await member_reads.member_page(self.records, ctx, first, after, ascending)
        page = await self.records.page(ctx.tenant, ctx.agent, first, after, ascending=ascending)
        hidden = await self._shadowed(ctx)
        return Page([r for r in page.records if visible(r, ctx) and r.id not in hidden], page.next_cursor)

    async def read(self, ctx: Context, rid: str, version: int | None = None) -> MemoryRecord:
        """For an operator: any of the agent's records, whatever its session or mode, but a
        member's facts. For a member: their own facts. For an agent (`read_memory`): a
        record it may read. Whatever its status; one the caller may not read is NOT_FOUND,
        as a missing one is."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        await self._check_subject(ctx, cfg)
        if ctx.principal.role in ("agent", "helper") and "read_memory" not in cfg.memory.tools:
            raise ApiError(ErrorCode.TOOL_NOT_ALLOWED, "tool", f"read_memory is not in memory.tools "
                           f"{cfg.memory.tools}; search_memory with ids reads current records")
        r = await self.records.get(ctx.tenant, ctx.agent, rid, version)
        if r is None or not readable_by(ctx, r):
            raise ApiError(ErrorCode.NOT_FOUND, "id", f"no record {rid} for this agent")
        return r

    async def history(self, ctx: Context, rid: str) -> list[MemoryRecord]:
        await self.read(ctx, rid)
        return await self.records.history(ctx.tenant, ctx.agent, rid)
