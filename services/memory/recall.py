"""Recall: what the agent should remember before its next model call, assembled from one
ranked search and the reads that run beside it (pins, blocks, session memory, shared layers),
then fitted to the block it renders."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from events.config import AgentConfig
from events.record import MemoryRecord
from events.rules.ledger import LIVE_FACT_CAP, RESERVED_KINDS
from events.rules.procedures import is_anti_pattern
from events.rules.procedures import rank as procedures_rank
from events.rules.recall_render import Entry, fit, fit_facts, pinned_within_budget, render, render_fitted
from events.rules.subjects import Refusal, SubjectState
from projections.qdrant.index import IndexUnavailable
from projections.redis.run_view import RunView
from services.memory.context import Context
from services.memory.ports import LayerSource, RecallAsk
from services.memory.recalled import OTHER, SAME, RecalledVersions
from services.memory.rules import NOT_MEMBER, check_role, shown_to
from services.memory.search import MemorySearch, SearchResult
from settings import Settings
from workers.runtime.metrics import RECALL_SECONDS, Timed

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords
    from services.memory.usage import UsageLog

Block = tuple[str, str, str, str | None]  # (scope, label, text, application)


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


def block_title(scope: str, label: str, application: str | None) -> str:
    """A block's heading in the rendered recall: its label, and where it comes from when not the agent's own."""
    where = ", ".join(w for w in ("workspace" if scope == "workspace" else "", application or "") if w)
    return f"{label} ({where})" if where else label


@dataclass
class _Shown:
    """What the rendered block shows, section by section, and its text."""

    pinned: list[MemoryRecord]
    records: list[MemoryRecord]
    rendered: str
    episodes: list[MemoryRecord] = field(default_factory=list)
    procedures: list[MemoryRecord] = field(default_factory=list)
    avoid: list[MemoryRecord] = field(default_factory=list)
    session_summary: str | None = None
    session_entries: list[Any] = field(default_factory=list)
    shared: dict[str, list[Entry]] = field(default_factory=dict)


def _facts_block(pinned: list[MemoryRecord], facts: list[MemoryRecord], summary: str | None,
                 entries: list[Any]) -> _Shown:
    """The facts block: pins and every live fact, one line each, the most relevant first, a fact
    that does not fit the block's 8,000 characters left out whole; no blocks, episodes or procedures."""
    kept, rendered = fit_facts(pinned + facts)
    kept_ids = {r.id for r in kept}
    return _Shown([r for r in pinned if r.id in kept_ids], [r for r in facts if r.id in kept_ids], rendered,
                  session_summary=summary, session_entries=entries)


def _layered_block(cfg: AgentConfig, pinned: list[MemoryRecord], facts: list[MemoryRecord],
                   fresh: list[tuple[MemoryRecord, float | None]], blocks: list[Block], summary: str | None,
                   entries: list[Any], shared: dict[str, list[Entry]]) -> _Shown:
    """memlane's block: each layer (pins, facts, blocks, episodes, procedures, session memory and
    the shared layers) as much of it as fits its budget."""
    facts = facts[: cfg.memory.search.max_results]
    shown = {r.id for r in facts}
    entries = [e for e in entries if e.record_id not in shown]  # a fact the recall shows already
    shown_blocks = [(block_title(scope, label, app), text) for scope, label, text, app in blocks]
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
    return _Shown(fitted.pinned, fitted.records, render_fitted(fitted), fitted.episodes, fitted.procedures,
                  fitted.avoid, fitted.session_summary, fitted.session_entries, fitted.shared)


class RecallReads(Protocol):
    """What a recall reads of the memory reads: the record view, the versions recalls showed,
    the usage log, the shared layers' sources, and the subject rules."""

    settings: Settings
    records: RedisRecords
    recalled: RecalledVersions
    usage: UsageLog
    layer_sources: list[LayerSource]
    at: datetime | None  # a past point's moment: a recall of the past, which marks and records nothing

    async def config(self, tenant: str, agent: str) -> AgentConfig: ...

    def now(self) -> datetime: ...

    async def _state(self, ctx: Context) -> SubjectState: ...

    def _refusal(self, ctx: Context, cfg: AgentConfig, state: SubjectState) -> Refusal | None: ...

    def _scopes(self, ctx: Context, cfg: AgentConfig) -> tuple[str, ...]: ...

    async def _shadowed(self, ctx: Context) -> set[str]: ...

    async def _blocks(self, ctx: Context, application: str | None = None) -> list[Block]: ...


class MemoryRecall:
    def __init__(self, reads: RecallReads, search: MemorySearch) -> None:
        self.reads = reads
        self.search = search

    @staticmethod
    def _empty(cfg: AgentConfig | None, skipped: Refusal | None = None, unavailable: bool = False) -> RecallResult:
        """An empty recall: the facts format appends nothing, memlane's block is empty."""
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
        reads = self.reads
        cfg: AgentConfig | None = None
        try:
            got_cfg, state = await asyncio.gather(reads.config(ctx.tenant, ctx.agent), reads._state(ctx),
                                                  return_exceptions=True)
            for got in (got_cfg, state):
                if isinstance(got, BaseException):
                    raise got
            cfg = cast(AgentConfig, got_cfg)  # the loop above raised any exception
            if not cfg.memory.enabled or reads.settings.memory_kill_switch:
                return self._empty(cfg)
            skipped = reads._refusal(ctx, cfg, cast(SubjectState, state))
            if skipped is not None:
                return self._empty(cfg, skipped=skipped)
            return await self._recall(ctx, cfg, conversation, text, run, application, request)
        except READ_FAILURES as e:
            log.warning("recall_memory_unavailable", tenant=ctx.tenant, agent=ctx.agent, error=type(e).__name__)
            return self._empty(cfg, unavailable=True)

    async def _recall(self, ctx: Context, cfg: AgentConfig, conversation: str, text: str,
                      run: str | None = None, application: str | None = None,
                      request: str | None = None) -> RecallResult:
        reads = self.reads
        scopes, now = reads._scopes(ctx, cfg), reads.now()
        # Every read that does not depend on the search runs while it runs, each one Redis call
        # or two: pins, blocks, the run's session memory and the shared layers. The search
        # stays in this task: its embedding time is the request's (Server-Timing).
        ask = RecallAsk(ctx, cfg, text, conversation, run, application)
        aside = (asyncio.ensure_future(reads._shadowed(ctx)),
                 asyncio.ensure_future(reads.records.pinned(ctx.tenant, ctx.agent)),
                 asyncio.ensure_future(reads._blocks(ctx, application)),
                 asyncio.ensure_future(self._session(ctx, run, now, cfg)),
                 asyncio.ensure_future(self._shared_layers(ask)))
        try:
            found = await self._recall_search(ctx, cfg, text)
            hidden, pinned_all, blocks, (summary, entries), shared = await asyncio.gather(*aside)
        except BaseException:
            for f in aside:
                f.cancel()
            # Retrieved, so a read that failed too is not reported again as never retrieved.
            await asyncio.gather(*aside, return_exceptions=True)
            raise
        pinned_all = [r for r in pinned_all if r.in_force(now) and shown_to(ctx, r, scopes) and r.id not in hidden]
        pinned = pinned_within_budget(pinned_all, cfg.memory.pinned.max_tokens if cfg.memory.pinned else None)
        # Episodes and procedures come from the same ranked search, in sections of their own
        # (why, and the figures: docs/decisions/0010-recall-sections-from-one-search.md).
        pinned_ids = {r.id for r in pinned}
        fresh = [(r, s) for r, s in found.records if r.id not in pinned_ids]
        again: set[str] = set()
        retried: set[str] = set()
        if reads.at is None:
            fresh, again, retried = await self._seen_before(ctx, cfg, conversation, fresh, request)
        facts = [r for r, _ in fresh if r.kind not in RESERVED_KINDS]
        if cfg.memory.recall.format == "facts":
            shown = _facts_block(pinned, facts, summary, entries)
        else:
            shown = _layered_block(cfg, pinned, facts, fresh, blocks, summary, entries, shared)
        if reads.at is not None:  # a recall of the past shows what was: it marks nothing and records no use
            return self._result(shown, fresh, blocks)
        await reads.usage.pinned(ctx, shown.pinned, conversation)
        new = [r for r in shown.records + shown.episodes + shown.procedures + shown.avoid
               if r.id not in again and r.id not in retried]
        if new:
            await reads.recalled.mark(ctx.tenant, ctx.agent, conversation, new, request)
            await reads.usage.retrieved(ctx, "recall", new, conversation)
        return self._result(shown, fresh, blocks)

    @staticmethod
    def _result(shown: _Shown, fresh: list[tuple[MemoryRecord, float | None]], blocks: list[Block]) -> RecallResult:
        scores = dict((r.id, s) for r, s in fresh)
        return RecallResult(shown.pinned, [(r, scores[r.id]) for r in shown.records], shown.rendered, shown.episodes,
                            shown.procedures, blocks, session_summary=shown.session_summary,
                            session_entries=shown.session_entries, avoid=shown.avoid, shared=shown.shared)

    async def _seen_before(self, ctx: Context, cfg: AgentConfig, conversation: str,
                           fresh: list[tuple[MemoryRecord, float | None]], request: str | None,
                           ) -> tuple[list[tuple[MemoryRecord, float | None]], set[str], set[str]]:
        """The found records, without those shown before when `memory.recall.recalled` is "omit";
        the ids this conversation's recalls showed before, and those this same request's earlier
        attempt showed. Neither is recorded as recalled again; the second is shown again."""
        again: set[str] = set()
        retried: set[str] = set()
        if fresh:
            seen = await self.reads.recalled.shown(ctx.tenant, ctx.agent, conversation, [r for r, _ in fresh], request)
            again = {r.id for (r, _), by in zip(fresh, seen) if by == OTHER}
            retried = {r.id for (r, _), by in zip(fresh, seen) if by == SAME}
            if cfg.memory.recall.recalled == "omit":
                fresh = [x for x in fresh if x[0].id not in again]
        return fresh, again, retried

    async def _recall_search(self, ctx: Context, cfg: AgentConfig, text: str) -> SearchResult:
        """Recall's ranked search, in two parts run together: facts (every kind but episodes and
        procedures) and those two kinds, which the facts format leaves out. In one list,
        hundreds of episodes that match a query word for word take every place ahead of a fact
        found by meaning: the fused score ranks them so (docs/decisions/0010-recall-sections-from-one-search.md)."""
        search = self.search
        every = cfg.memory.recall.format == "facts"  # the facts block shows every live fact
        limit = LIVE_FACT_CAP if every else cfg.memory.search.max_results * 2
        if not text.strip():
            return await search.checked(ctx, cfg, query=text, limit=limit)
        dense = None if cfg.memory.search.mode == "lexical" else await search.embed_query(ctx, text)
        parts: list[tuple[tuple[str, ...], tuple[str, ...]]] = [((), RESERVED_KINDS)]  # (kinds, not_kinds)
        if not every:
            parts.append((RESERVED_KINDS, ()))
        found = await search.run(ctx, [search.ranked(ctx, cfg, text, None, None, limit, None, None, dense, kinds=kinds,
                                                     not_kinds=not_kinds) for kinds, not_kinds in parts])
        ranked = [x for part in found for x in part.records]
        if every:  # then the facts no search ranked, newest first
            seen = {r.id for r, _ in ranked}
            listed = await search.checked(ctx, cfg, query=None, limit=limit)
            ranked += [(r, None) for r, _ in listed.records if r.id not in seen and r.kind not in RESERVED_KINDS]
        return SearchResult(ranked, None)

    async def _shared_layers(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """Every layer source's entries, by layer heading; the facts format has none."""
        if not self.reads.layer_sources or ask.cfg.memory.recall.format == "facts":
            return {}
        out: dict[str, list[Entry]] = {}
        for got in await asyncio.gather(*(source(ask) for source in self.reads.layer_sources)):
            for heading, entries in got.items():
                out.setdefault(heading, []).extend(entries)
        return out

    async def _session(self, ctx: Context, run: str | None, now: Any, cfg: AgentConfig) -> tuple[str | None, list]:
        """The run's summary and its entries, newest first: what fits of a long run is its latest.
        The facts format has no session layers, and an operator gets no member's."""
        if run is None or cfg.memory.recall.format == "facts":
            return None, []
        if ctx.principal.role == "operator" and ctx.user is not None:
            return None, []  # a member's session memory is never an operator's to read
        entries, summary = await RunView(self.reads.records).session(ctx.tenant, ctx.agent, run, now, ctx.user)
        return summary, entries[::-1]
