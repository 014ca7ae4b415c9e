"""Memory tools and search: the application service behind HTTP, MCP and the client.

Reads come from the projections (Qdrant for ranking, Redis for records); writes go to
the ledger as commands. Every rule that protects one agent from another is applied
here, on top of the filters the index applies.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from pydantic_core import PydanticSerializationError, to_json

from events.base import utcnow
from events.codec import encode
from events.commands import (
    WORKSPACE,
    AddMemory,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    PinMemory,
    ReportOutcome,
    UnpinMemory,
)
from events.config import AgentConfig
from events.limits import COMMAND_LIMIT, MESSAGE_LIMIT, largest_field, too_large
from events.record import MemoryRecord, Provenance, Scope, Source
from events.topics import COMMANDS, USAGE
from events.usage import ModelUsage, Retrieved, RetrievedItem
from projections.embedder import Embedder
from projections.qdrant_index import SearchFilter
from projections.records import CursorError, Page, encode_cursor, sort_score
from projections.redis_records import RedisRecords
from services.auth import Principal
from services.recall_render import fit, pinned_within_budget, render, render_fitted
from services.settings import Settings
from workers import write_filter
from workers.kafka_io import producer as kafka_producer
from workers.ledger_rules import RESERVED_KINDS

if TYPE_CHECKING:
    from workers.memory_shards import MemoryShards

log = structlog.get_logger()

STATUS_BY_CODE = {
    "VALIDATION_FAILED": 422,
    "SCOPE_NOT_ALLOWED": 403,
    "TOOL_NOT_ALLOWED": 403,
    "PIN_NOT_ENABLED": 403,
    "MEMORY_DISABLED": 403,
    "READ_ONLY_KEY": 403,
    "PREVIEW_READ_ONLY": 403,
    "NOT_FOUND": 404,
    "NOT_LIVE": 409,
    "DUPLICATE_ID": 409,
    "LIMIT_EXCEEDED": 409,
    "PIN_BUDGET_EXCEEDED": 409,
    "TIMEOUT": 504,
}


class ApiError(Exception):
    def __init__(self, code: str, field: str | None, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code, self.field, self.message = code, field, message
        self.status = status or STATUS_BY_CODE.get(code, 400)


@dataclass(frozen=True)
class Context:
    """Who is asking, from where: the key's principal plus the turn it speaks for."""

    principal: Principal
    agent: str
    session: str | None = None
    preview: bool = False
    turn_ref: str | None = None
    execution_id: str | None = None
    turn: int | None = None

    @property
    def tenant(self) -> str:
        return self.principal.tenant


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


RECALLED_TTL_S = 7 * 24 * 3600
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
                and r.in_force(now) and MemoryService.visible(r, self.ctx, self.scopes)]
        kept.sort(key=lambda rs: (-round(rs[1], 9), -rs[0].created.timestamp()))
        return SearchResult(kept[:self.limit], None)


class MemoryService:
    def __init__(
        self,
        settings: Settings,
        records: RedisRecords,
        memory: MemoryShards,
        embedder: Embedder,
        producer: AIOKafkaProducer,
    ) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory
        self.embedder = embedder
        self.producer = producer

    def use_shards(self, memory: MemoryShards) -> None:
        self.memory = memory

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.records.config(tenant, agent) or AgentConfig()

    # ------------------------------------------------------------------ visibility

    @staticmethod
    def readable_scopes(cfg: AgentConfig, session: str | None) -> tuple[str, ...]:
        scopes = []
        if "agent" in cfg.memory.scope.read:
            scopes.append(Scope.AGENT.value)
        if "session" in cfg.memory.scope.read and session:
            scopes.append(Scope.SESSION.value)
        return tuple(scopes)

    @staticmethod
    def visible(r: MemoryRecord, ctx: Context, scopes: tuple[str, ...] | None = None) -> bool:
        if r.tenant != ctx.tenant or r.agent != ctx.agent:
            return False
        if r.scope is Scope.SESSION and r.session != ctx.session:
            return False
        if scopes is not None and r.scope.value not in scopes:
            return False
        return ctx.preview or not r.preview

    async def blocks(self, ctx: Context) -> list[tuple[str, str, str]]:
        """The blocks an agent's recall shows (seed 002): (scope, label, text), the tenant's
        workspace-wide ones first, each scope by label."""
        self._check_enabled(ctx, await self.config(ctx.tenant, ctx.agent))
        return await self._blocks(ctx)

    async def _blocks(self, ctx: Context) -> list[tuple[str, str, str]]:
        workspace, own = await asyncio.gather(self.records.blocks(ctx.tenant, WORKSPACE),
                                              self.records.blocks(ctx.tenant, ctx.agent))
        return [("workspace", *b) for b in sorted(workspace.items())] + [("agent", *b) for b in sorted(own.items())]

    async def curate(self, ctx: Context, label: str, action: str, line: str | None, old: str | None,
                     scope: str = "agent", wait: bool = True) -> dict[str, Any]:
        if scope == "workspace":
            if ctx.principal.role != "operator":
                raise ApiError("FORBIDDEN", "scope", "only an operator key curates workspace-wide blocks", 403)
            ctx = dataclasses.replace(ctx, agent=WORKSPACE)
        await self._check_tool(ctx, "curate_block")
        cmd = self._command(CurateBlock, ctx, label=label, action=action, line=line, old=old)
        self._screen(ctx, label=cmd.label, line=cmd.line)
        return await self._submit(cmd, wait)

    async def report(self, ctx: Context, rid: str, success: bool, wait: bool = True) -> dict[str, Any]:
        """Seed 002: an outcome of applying a procedure, counted on it."""
        await self._check_tool(ctx, "report_outcome")
        return await self._submit(self._command(ReportOutcome, ctx, record_id=rid, success=success, session=ctx.session),
                                  wait)

    async def _shadowed(self, ctx: Context) -> set[str]:
        """Seed 000: a preview turn sees every record except the live ones a preview record
        replaces or deletes. (Ranked search filters on the index's own flag.)"""
        return await self.records.shadowed(ctx.tenant, ctx.agent) if ctx.preview else set()

    def _check_enabled(self, ctx: Context, cfg: AgentConfig) -> None:
        """Seed 003: with memory off, an agent's memory calls are refused at once. An
        operator still lists, reads and deletes (seed 004: the dashboard, and deletion)."""
        if ctx.principal.role == "operator":
            return
        if self.settings.memory_kill_switch:
            raise ApiError("MEMORY_DISABLED", "AGENT_MEMORY_KILL_SWITCH",
                           "memory is switched off for this deployment; unset AGENT_MEMORY_KILL_SWITCH to turn it on")
        if not cfg.memory.enabled:
            raise ApiError("MEMORY_DISABLED", "memory.enabled",
                           "memory is off for this agent; an operator sets memory.enabled to true to turn it on")

    # ------------------------------------------------------------------ reads

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
        scopes = self.readable_scopes(cfg, ctx.session)
        if ids:
            found = await self.records.get_many(ctx.tenant, ctx.agent, ids[:100])
            hidden = await self._shadowed(ctx)
            keep = [r for r in found if self.visible(r, ctx, scopes) and r.in_force(utcnow()) and r.id not in hidden]
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
        scopes = self.readable_scopes(cfg, ctx.session)
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
                await self.record_usage(
                    ModelUsage(**self._usage_base(ctx), purpose="embed", model=self.embedder.model_id,
                               input_tokens=len(kw["query"].split()), latency_ms=ms)
                )

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
                return ApiError("VALIDATION_FAILED", "after", f"after: {e}", 422)

        return list(await asyncio.gather(*(one(i) for i in range(len(searches)))))

    async def _embed_query(self, ctx: Context, query: str) -> list[float]:
        t0 = asyncio.get_running_loop().time()
        vec = (await asyncio.to_thread(self.embedder.embed, [query]))[0]
        EMBED_MS.set((asyncio.get_running_loop().time() - t0) * 1000)
        await self.record_usage(
            ModelUsage(
                **self._usage_base(ctx),
                purpose="embed",
                model=self.embedder.model_id,
                input_tokens=len(query.split()),
                latency_ms=(asyncio.get_running_loop().time() - t0) * 1000,
            )
        )
        return vec

    def _usage_base(self, ctx: Context) -> dict[str, Any]:
        return dict(
            usage_id=str(uuid.uuid4()),
            tenant=ctx.tenant,
            agent=ctx.agent,
            occurred_at=utcnow(),
            session=ctx.session,
            execution_id=ctx.execution_id,
            turn=ctx.turn,
        )

    async def record_usage(self, usage: Any) -> None:
        await self.producer.send(self.settings.topic(USAGE.name), encode(usage), key=USAGE.key_bytes(usage))

    async def record_retrieved(
        self, ctx: Context, tool: str, records: list[MemoryRecord], conversation: str | None = None
    ) -> None:
        if records:
            await self.record_usage(
                Retrieved(
                    **self._usage_base(ctx),
                    tool=tool,
                    recall=tool == "recall",
                    conversation=conversation,
                    items=[RetrievedItem(id=r.id, version=r.version) for r in records],
                )
            )

    async def recall(self, ctx: Context, conversation: str, text: str) -> RecallResult:
        """What the agent should remember before its next model call (seed 000)."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        if not cfg.memory.enabled or self.settings.memory_kill_switch:
            return RecallResult([], [], render([], []), [], [], [])
        scopes, now = self.readable_scopes(cfg, ctx.session), utcnow()
        hidden = await self._shadowed(ctx)
        pinned_all = [
            r for r in await self.records.pinned(ctx.tenant, ctx.agent)
            if r.in_force(now) and self.visible(r, ctx, scopes) and r.id not in hidden
        ]
        pinned = pinned_within_budget(pinned_all, cfg.memory.pinned.max_tokens if cfg.memory.pinned else None)
        # Episodes and procedures (seed 002) come from the same ranked search and have
        # sections of their own, so they never take the places of facts. A search of their
        # own per kind cost recall about 4 ms each, and a deeper one 4 ms in all (100,000
        # records in the agent), so those that rank among the search's first results come.
        found = await self.search(ctx, query=text, limit=cfg.memory.search.max_results * 2, cfg=cfg)
        key = f"{self.records.root}recalled:{ctx.tenant}/{ctx.agent}:{conversation}"
        pinned_ids = {r.id for r in pinned}
        fresh = [(r, s) for r, s in found.records if r.id not in pinned_ids]
        if fresh:
            seen = await self.records.r.smismember(key, [f"{r.id}:{r.version}" for r, _ in fresh])
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
            await self.records.r.sadd(key, *[f"{r.id}:{r.version}" for r in shown])
            await self.records.r.expire(key, RECALLED_TTL_S)
            await self.record_retrieved(ctx, "recall", shown, conversation)
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
                and self.visible(r, ctx, scopes)
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
        """`Action.memories` (seed 000): a page of the agent's listed records by creation time.
        An operator sees every session's and preview records; an agent what it may read."""
        self._check_enabled(ctx, await self.config(ctx.tenant, ctx.agent))
        page = await self.records.page(ctx.tenant, ctx.agent, first, after, ascending=ascending)
        if ctx.principal.role == "operator":
            return page
        hidden = await self._shadowed(ctx)
        return Page([r for r in page.records if self.visible(r, ctx) and r.id not in hidden], page.next_cursor)

    async def read(self, ctx: Context, rid: str, version: int | None = None) -> MemoryRecord:
        """`agentMemory` for an operator: any of the agent's records, whatever its session or
        mode. `read_memory` for an agent: a record it may read, whatever its status."""
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        operator = ctx.principal.role == "operator"
        if not operator and "read_memory" not in cfg.memory.tools:
            raise ApiError("TOOL_NOT_ALLOWED", "tool", f"read_memory is not in memory.tools {cfg.memory.tools}; "
                           "search_memory with ids reads current records")
        r = await self.records.get(ctx.tenant, ctx.agent, rid, version)
        if r is None or not (operator or self.visible(r, ctx)):
            raise ApiError("NOT_FOUND", "id", f"no record {rid} for this agent")
        return r

    async def history(self, ctx: Context, rid: str) -> list[MemoryRecord]:
        await self.read(ctx, rid)
        return await self.records.history(ctx.tenant, ctx.agent, rid)

    # ------------------------------------------------------------------ writes

    def _provenance(self, ctx: Context) -> Provenance:
        return Provenance(
            source=Source.OPERATOR if ctx.principal.role == "operator" else Source.TOOL,
            execution_id=ctx.execution_id,
            session=ctx.session,
            turn=ctx.turn,
            modified_by=f"{ctx.principal.role}:{ctx.principal.agent or ctx.tenant}",
        )

    async def _check_tool(self, ctx: Context, tool: str) -> AgentConfig:
        if not ctx.principal.can_write:
            raise ApiError("READ_ONLY_KEY", None, "this key can search memory but never write it")
        cfg = await self.config(ctx.tenant, ctx.agent)
        self._check_enabled(ctx, cfg)
        if ctx.principal.role != "operator" and tool not in cfg.memory.tools:
            raise ApiError(
                "TOOL_NOT_ALLOWED", "tool", f"{tool} is not in memory.tools {cfg.memory.tools}; nothing was changed"
            )
        return cfg

    def _screen(self, ctx: Context, **fields: Any) -> None:
        """The write-time filter on an agent's own write, as on a model's: only an operator's
        write bypasses it. The refusal names the field and the rule, never the text."""
        if self._provenance(ctx).source is Source.OPERATOR:
            return
        if hit := write_filter.check_write(**fields):
            raise ApiError("WRITE_REFUSED", hit.field, hit.message(), 422)

    async def add(self, ctx: Context, wait: bool = True, **fields: Any) -> dict[str, Any]:
        await self._check_tool(ctx, "add_memory")
        cmd = self._command(AddMemory, ctx, session=ctx.session, **fields)  # validated, so within its limits
        self._screen(ctx, summary=cmd.summary, content=cmd.content, kind=cmd.kind, labels=cmd.labels,
                     metadata=cmd.metadata)
        return await self._submit(cmd, wait)

    def _command(self, cls: type, ctx: Context, **fields: Any) -> Any:
        """A command spoken for `ctx`: its agent, its turn, its provenance."""
        return cls(
            command_id=fields.pop("command_id", None) or str(uuid.uuid4()),
            tenant=ctx.tenant,
            agent=ctx.agent,
            issued_at=utcnow(),
            provenance=self._provenance(ctx),
            turn_ref=ctx.turn_ref,
            preview=ctx.preview,
            **fields,
        )

    async def delete(self, ctx: Context, rid: str, wait: bool = True) -> dict[str, Any]:
        await self._check_tool(ctx, "delete_memory")
        return await self._submit(self._command(DeleteMemory, ctx, record_id=rid, session=ctx.session), wait)

    async def edit(self, ctx: Context, rid: str, wait: bool = True, **fields: Any) -> dict[str, Any]:
        if ctx.principal.role != "operator":
            raise ApiError("FORBIDDEN", None, "only an operator key can edit a record; agents replace them", 403)
        return await self._submit(self._command(EditMemory, ctx, record_id=rid, **fields), wait)

    async def pin(self, ctx: Context, rid: str, pinned: bool, wait: bool = True) -> dict[str, Any]:
        await self._check_tool(ctx, "pin_memory" if pinned else "unpin_memory")
        return await self._submit(self._command(PinMemory if pinned else UnpinMemory, ctx, record_id=rid, session=ctx.session), wait)

    async def configure(self, ctx: Context, config: AgentConfig, wait: bool = True) -> dict[str, Any]:
        if ctx.principal.role != "operator":
            raise ApiError("FORBIDDEN", None, "only an operator key can change an agent's configuration", 403)
        return await self._submit(self._command(ConfigureAgent, ctx, config=config), wait)

    async def _submit(self, cmd: Any, wait: bool) -> dict[str, Any]:
        data = _encoded(cmd)
        fut = self.memory.wait_for(cmd.command_id, cmd.tenant, cmd.agent) if wait else None
        try:
            await self._send_command(cmd, data)
        except BaseException:
            if fut is not None:
                fut.cancel()  # nobody waits for a command that was never sent
            raise
        if fut is None:
            return {"command_id": cmd.command_id, "status": "accepted"}
        try:
            events = await asyncio.wait_for(fut, timeout=30)
        except TimeoutError:
            raise ApiError(
                "TIMEOUT", None, f"command {cmd.command_id} was accepted but not applied within 30 s; check the workers"
            ) from None
        return await self._outcome(cmd, events)

    async def _send_command(self, cmd: Any, data: bytes) -> None:
        """Sends `data` once, or twice when the first send failed and left the producer
        unusable: the ledger applies a command id of an agent once, so a second copy is
        harmless. A failed send that the broker refused leaves a gap in the idempotent
        producer's sequence, and every later send to that partition would then fail with
        OutOfOrderSequenceNumber; a fresh producer starts a new sequence."""
        for attempt in (1, 2):
            used = self.producer
            try:
                await used.send_and_wait(self.settings.topic(COMMANDS.name), data, key=COMMANDS.key_bytes(cmd))
                return
            except KafkaError as e:
                log.warning("command_send_failed", error=type(e).__name__, retriable=e.retriable, attempt=attempt)
                if not e.retriable:
                    await self._renew_producer(used)
                if isinstance(e, MessageSizeTooLargeError):
                    field = largest_field(cmd)
                    raise ApiError("LIMIT_EXCEEDED", field, too_large("the command", len(data), MESSAGE_LIMIT, field),
                                   413) from None
                if e.retriable or attempt == 2:
                    raise ApiError("UNAVAILABLE", None, "the command could not be written to the log; send it again "
                                   f"with the same command_id ({cmd.command_id}), which applies it once", 503) from None

    async def _renew_producer(self, failed: AIOKafkaProducer) -> None:
        """Replaces `failed` unless a concurrent request already did; the old one is closed
        in the background, its own pending sends failing or completing as they will."""
        lock = self.__dict__.setdefault("_renewing", asyncio.Lock())
        async with lock:
            if self.producer is not failed:
                return
            fresh = kafka_producer(self.settings)
            await fresh.start()
            self.producer = fresh
        log.warning("command_producer_renewed")
        closing = asyncio.ensure_future(asyncio.wait_for(failed.stop(), timeout=10))
        self.__dict__.setdefault("_closing", set()).add(closing)
        closing.add_done_callback(lambda t: (self._closing.discard(t), t.cancelled() or t.exception()))

    async def _outcome(self, cmd: Any, events: list[Any]) -> dict[str, Any]:
        for e in events:
            if e.type == "CommandRejected":
                raise ApiError(e.code, e.field, e.reason)
        result: dict[str, Any] = {"command_id": cmd.command_id, "status": "applied", "memories": []}
        for e in events:
            if e.type == "WriteStaged":
                result["status"] = "pending_turn"
            elif e.type == "WriteDiscarded":
                result["status"] = "discarded"
                result["reason"] = e.reason
            elif e.type == "BlockChanged":
                result["block"] = {"label": e.label, "text": e.text}
            elif hasattr(e, "record"):
                result["memories"].append(e.record.model_dump(mode="json"))
                if getattr(e, "merged", False):
                    result["merged"] = True
                    result["id"] = e.record.id
                elif e.type in ("RecordAdded", "RecordDeleted", "RecordPinned", "RecordUnpinned", "RecordRevised"):
                    result.setdefault("id", e.record.id)
        # Read-your-writes: the Redis projection is a separate process; wait for it too, and
        # never answer "applied" for what a read right after would not show.
        if block := result.get("block"):

            async def block_shown() -> bool:
                return (await self.records.blocks(cmd.tenant, cmd.agent)).get(block["label"], "") == block["text"]

            await self._seen(cmd, block_shown, f"block {block['label']}'s new text")
        if "id" in result:
            rid = result["id"]
            want = max(m["version"] for m in result["memories"] if m["id"] == rid)

            async def record_shown() -> bool:
                r = await self.records.get(cmd.tenant, cmd.agent, rid)
                return bool(r and r.version >= want)

            await self._seen(cmd, record_shown, f"version {want} of record {rid}")
        return result

    READ_YOUR_WRITES_S = 6.0

    async def _seen(self, cmd: Any, shown: Any, what: str) -> None:
        """Polls `shown` until the record view (the redis-projection worker's) has caught up,
        or raises TIMEOUT naming what it did not show."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.READ_YOUR_WRITES_S
        while not await shown():
            if loop.time() >= deadline:
                raise ApiError(
                    "TIMEOUT", None,
                    f"command {cmd.command_id} was applied by the ledger, but the record view (the redis-projection "
                    f"worker) did not show {what} within {self.READ_YOUR_WRITES_S:g} s; check that worker and "
                    "read again before writing again")
            await asyncio.sleep(0.02)


def _encoded(cmd: Any) -> bytes:
    """The command as sent, refused before sending when it is over `COMMAND_LIMIT` (every
    event the ledger makes of it must fit the broker's message limit) or holds a string
    that is not text (a lone surrogate cannot be encoded)."""
    try:
        data = encode(cmd)
    except PydanticSerializationError:
        field = next((f for f in type(cmd).model_fields if not _serializable(getattr(cmd, f))), None)
        raise ApiError("VALIDATION_FAILED", field, f"{field or 'the command'} holds a string that is not valid "
                       "Unicode text (a lone surrogate); send UTF-8 text", 422) from None
    if len(data) > COMMAND_LIMIT:
        field = largest_field(cmd)
        raise ApiError("LIMIT_EXCEEDED", field, too_large("the command", len(data), COMMAND_LIMIT, field), 413)
    return data


def _serializable(value: Any) -> bool:
    try:
        to_json(value)
    except PydanticSerializationError:
        return False
    return True
