"""A batch of searches, each with its own context, answered as `search` would answer them one
by one, but embedded and ranked together: that sharing is what makes a batch cheap."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from events.base import utcnow
from events.config import AgentConfig
from events.errors import ErrorCode
from events.record import MemoryRecord
from events.rules.subjects import Refusal, SubjectState
from projections.records import CursorError
from services.errors import ApiError
from services.memory.context import Context
from services.memory.rules import NOT_MEMBER, check_role, refused
from services.memory.search import MemorySearch, Ranked, SearchReads, SearchResult

if TYPE_CHECKING:
    from workers.followers.memory_shards import MemoryShards


class BatchReads(SearchReads, Protocol):
    """What a batch reads of the memory reads beyond a search's: each subject's state and the
    one rule that refuses it."""

    def _subject_user(self, ctx: Context) -> str | None: ...

    async def _state(self, ctx: Context) -> SubjectState: ...

    def _refusal(self, ctx: Context, cfg: AgentConfig, state: SubjectState) -> Refusal | None: ...


@dataclass
class _Batch:
    """One batch's searches, and what each step learns of them, by the search's place in the batch."""

    searches: list[tuple[Context, dict[str, Any]]]
    named_times: bool = True  # a time a query names ranks first (`MemorySearch.ranked`)
    cfgs: dict[tuple[str, str], AgentConfig] = field(default_factory=dict)
    refused_at: dict[int, ApiError] = field(default_factory=dict)
    vectors: dict[int, list[float]] = field(default_factory=dict)
    ranked: dict[int, Ranked] = field(default_factory=dict)
    hits: dict[int, list[Any]] = field(default_factory=dict)
    found: dict[tuple[str, str], dict[str, MemoryRecord]] = field(default_factory=dict)

    def cfg(self, ctx: Context) -> AgentConfig:
        return self.cfgs[(ctx.tenant, ctx.agent)]

    def is_ranked(self, i: int) -> bool:
        """A query and no ids: the index ranks it."""
        kw = self.searches[i][1]
        return i not in self.refused_at and bool(kw.get("query")) and not kw.get("ids")


class BatchSearch:
    def __init__(self, reads: BatchReads, search: MemorySearch) -> None:
        self.reads = reads
        self.search = search

    async def search_many(self, searches: list[tuple[Context, dict[str, Any]]],
                          named_times: bool = True) -> list[SearchResult | ApiError]:
        """Several searches, each with its own context, as `search` would run them one by one
        (`named_times`: as `MemorySearch.ranked` takes it).

        The queries that need a vector are embedded in one embedder call: one model request
        (or one ONNX batch) instead of one per query is what makes a batch cheap. A search
        that fails with an ApiError gets it in its place; the others still answer. Each
        search's subject (its context's member) is checked on its own.
        """
        batch = _Batch(searches, named_times)
        await self._configs(batch)
        await self._check(batch)
        todo = [i for i, (ctx, kw) in enumerate(searches)
                if i not in batch.refused_at and self._needs_vector(batch, ctx, kw)]
        if todo:
            await self._embed(batch, todo)
        await self._rank(batch)
        now = utcnow()
        return list(await asyncio.gather(*(self._answer(batch, i, now) for i in range(len(searches)))))

    async def _configs(self, batch: _Batch) -> None:
        """Each agent's configuration once."""
        for ctx, _ in batch.searches:
            if (ctx.tenant, ctx.agent) not in batch.cfgs:
                batch.cfgs[(ctx.tenant, ctx.agent)] = await self.reads.config(ctx.tenant, ctx.agent)

    async def _check(self, batch: _Batch) -> None:
        """Refuses each search its caller may not make, as `search` checks it (role, memory on, subject)."""
        reads = self.reads
        # Each subject's state once, read together: a batch is often one agent's many members.
        firsts = {(ctx.tenant, ctx.agent, reads._subject_user(ctx)): ctx for ctx, _ in batch.searches}
        states: dict[tuple[str, str, str | None], SubjectState] = dict(
            zip(firsts, await asyncio.gather(*(reads._state(ctx) for ctx in firsts.values()))))
        for i, (ctx, _) in enumerate(batch.searches):
            cfg = batch.cfg(ctx)
            try:
                check_role(ctx, NOT_MEMBER, "search memory")
                reads._check_enabled(ctx, cfg)
                refused(reads._refusal(ctx, cfg, states[(ctx.tenant, ctx.agent, reads._subject_user(ctx))]))
            except ApiError as e:
                batch.refused_at[i] = e

    @staticmethod
    def _needs_vector(batch: _Batch, ctx: Context, kw: dict[str, Any]) -> bool:
        mode = kw.get("mode") or batch.cfg(ctx).memory.search.mode
        return bool(kw.get("query")) and not kw.get("ids") and mode != "lexical"

    async def _embed(self, batch: _Batch, todo: list[int]) -> None:
        """The vectors of the searches at `todo`, and a usage record for each."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        by_text = await self._embed_texts(batch, todo)
        ms = (loop.time() - t0) * 1000
        for i in todo:
            if i in batch.refused_at:
                continue
            ctx, kw = batch.searches[i]
            batch.vectors[i] = by_text[(ctx.tenant, kw["query"])]
            # One usage record per query, as a single search records it.
            await self.reads.usage.embedded(ctx, kw["query"], ms)

    async def _embed_texts(self, batch: _Batch, todo: list[int]) -> dict[tuple[str, str], list[float]]:
        """Each vector by (tenant, text). Each distinct text of a tenant is embedded once: short
        replies ("ok", "Noted.") repeat across sessions. Each tenant's texts wait in its own queue:
        one refused (429) refuses its items."""
        searches = batch.searches
        per_tenant: dict[str, list[str]] = {}
        for i in todo:
            per_tenant.setdefault(searches[i][0].tenant, []).append(searches[i][1]["query"])
        tenants = list(per_tenant)
        texts = {t: list(dict.fromkeys(qs)) for t, qs in per_tenant.items()}
        answers = await asyncio.gather(*(self.reads.fair.embed(t, texts[t]) for t in tenants), return_exceptions=True)
        by_text: dict[tuple[str, str], list[float]] = {}
        for t, got in zip(tenants, answers, strict=True):
            if isinstance(got, ApiError):
                batch.refused_at.update({i: got for i in todo if searches[i][0].tenant == t})
            elif isinstance(got, BaseException):
                raise got
            else:
                by_text.update({(t, q): v for q, v in zip(texts[t], got, strict=True)})
        return by_text

    async def _rank(self, batch: _Batch) -> None:
        """Runs the ranked searches (a query, no ids) together and reads the records they hit."""
        # The index searches in one worker thread hop, and the records they hit are read in one
        # Redis read per agent. One by one, a batch of 32 cost 32 thread hops and 96 Redis round
        # trips (and as many pooled connections), more than the searches themselves.
        for i, (ctx, kw) in enumerate(batch.searches):
            if batch.is_ranked(i):
                args: dict[str, Any] = {k: kw.get(k) for k in ("kind", "labels", "limit", "mode", "min_score")}
                args["tags"] = tuple(kw.get("tags") or ())
                args["named_times"] = batch.named_times
                batch.ranked[i] = self.search.ranked(ctx, batch.cfg(ctx), kw["query"], dense=batch.vectors.get(i),
                                                     **args)
        ranked = batch.ranked
        batch.hits = await asyncio.to_thread(lambda: {i: q.run(cast("MemoryShards", self.reads.memory))
                                                      for i, q in ranked.items()})
        wanted: dict[tuple[str, str], dict[str, None]] = {}
        for i, q in ranked.items():
            wanted.setdefault((q.ctx.tenant, q.ctx.agent), {}).update(dict.fromkeys(h.record_id for h in batch.hits[i]))
        for (tenant, agent), rids in wanted.items():
            got = await self.reads.records.get_many(tenant, agent, list(rids))
            batch.found[(tenant, agent)] = {r.id: r for r in got}

    async def _answer(self, batch: _Batch, i: int, now: Any) -> SearchResult | ApiError:
        """The answer in place `i`: its refusal, its ranked hits, or the search by ids or listing it asks."""
        ctx, kw = batch.searches[i]
        if i in batch.refused_at:
            return batch.refused_at[i]
        if i in batch.ranked:
            return batch.ranked[i].result(batch.hits[i], batch.found[(ctx.tenant, ctx.agent)], now)
        try:
            return await self.search.checked(ctx, batch.cfg(ctx), **kw, dense=batch.vectors.get(i))
        except ApiError as e:
            return e
        except CursorError as e:
            return ApiError(ErrorCode.VALIDATION_FAILED, "after", f"after: {e}", 422)
