"""HTTP API (FastAPI; OpenAPI at /openapi.json, docs at /docs).

The serving process also runs the Qdrant projection for its shard, because an Edge
shard belongs to one process (DESIGN.md, "Real components").
"""


import asyncio
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

import structlog
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_json

from events.base import Ident
from events.codec import from_validation_error
from events.commands import WORKSPACE
from events.config import AgentConfig
from events.limits import check_labels, check_metadata
from events.record import Scope
from projections.embedder import make_embedder
from projections.records import CursorError
from projections.redis_records import RedisRecords
from projections.redis_records import connect as connect_redis
from services.auth import KeyStore, Principal
from services.health import HealthProbe, assess
from services.input_guard import GuardBodies
from services.memory_service import EMBED_MS, ApiError, Context, MemoryService
from services.settings import Settings, get_settings
from workers.kafka_io import ensure_topics, producer, wait_for_broker
from workers.memory_shards import MemoryShards, current_generation

log = structlog.get_logger()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Checked where the request is parsed, before any other work: a body too deep or too
# large for a command is refused here with the limit, never deeper in the service.
Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata)]
Labels = Annotated[dict[str, str], AfterValidator(check_labels)]


class SearchRequest(_Body):
    query: Annotated[str, Field(max_length=4000)] | None = None
    kind: str | None = None
    labels: dict[str, str] = {}
    ids: Annotated[list[str], Field(max_length=100)] = []
    limit: Annotated[int, Field(ge=1, le=100)] | None = None
    after: str | None = None
    mode: Literal["hybrid", "lexical", "vector"] | None = None
    min_score: Annotated[float, Field(ge=-1, le=1)] | None = None


class SearchItem(SearchRequest):
    # Whose memory the search reads: the X-Tenant, X-Agent, X-Session and X-Preview headers
    # of a single search, given per item (the request's headers when left out).
    tenant: str | None = None
    agent: str | None = None
    session: str | None = None
    preview: bool | None = None


class SearchBatchRequest(_Body):
    searches: Annotated[list[SearchItem], Field(min_length=1, max_length=100)]
    # A RETRIEVED use is an agent's search whose records reached its model. The extraction
    # worker's review lookups never reach the agent's model (they are shown to the review's,
    # and the proposals record the handles shown), so it turns this off; only an operator
    # key may, so an agent cannot hide its own retrievals.
    retrieved: bool = Field(True, description="record each search as the agent's RETRIEVED use; "
                                              "false (operator keys only) for lookups that never reach the agent's model")


class RecallRequest(_Body):
    conversation: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=16_000)]


class AddRequest(_Body):
    summary: str
    content: str = ""
    kind: str = "fact"
    labels: Labels = {}
    scope: Scope | None = None
    pinned: bool = False
    replaces: str | None = None
    key: str | None = None
    confidence: float | None = None
    expires_at: datetime | None = None  # at most 180 days ahead; later dates are clamped
    metadata: Metadata = {}
    command_id: str | None = None


class OutcomeRequest(_Body):
    success: bool


class CurateRequest(_Body):
    action: Literal["add", "replace", "remove"]
    line: str | None = Field(None, description="add, replace: the line to write (one line, at most 2,000 characters)")
    old: str | None = Field(None, description="replace, remove: the line to change, as the block holds it now")


class EditRequest(_Body):
    summary: str | None = None
    content: str | None = None
    metadata: Metadata | None = None


class KeyRequest(_Body):
    # Names travel in Kafka and Redis keys: the contract's identifier rule, checked here
    # so a bad name is refused when the key is issued, not at its first write.
    tenant: Ident
    agent: Ident | None = None
    role: Literal["agent", "helper", "operator"] = "agent"


class FastJSONResponse(JSONResponse):
    """The same compact UTF-8 JSON, written by pydantic-core: the stdlib encoder was a tenth
    of a search batch's handling (32 searches, their records and scores)."""

    def render(self, content: Any) -> bytes:
        return to_json(content)


def record_out(r, score: float | None = None) -> dict[str, Any]:
    # Already JSON-safe: the hot paths return it in a JSONResponse, which skips FastAPI's
    # jsonable_encoder walk (a tenth of the API's time under extraction load).
    d = r.model_dump(mode="json")
    if score is not None:
        d["score"] = score
    return d


class ShardOwner:
    """Owns the memory shards of the current generation and their projection task.

    `memlane rebuild` fills the next generation beside this one and moves the pointer;
    the owner then opens the new shards, lets their projections catch up, and swaps.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.generation = 0
        self.memory: MemoryShards | None = None
        self.task: asyncio.Task | None = None
        self.on_swap = None
        self.embedder = None  # the process's, for the points the shards' reconciler heals

    async def open(self, generation: int) -> None:
        memory = MemoryShards(self.settings, generation, self.embedder)
        task = asyncio.create_task(memory.run(), name=f"qdrant-projection-g{generation}")
        old = (self.memory, self.task)
        if old[0] is not None:
            await memory.caught_up()
        self.memory, self.task, self.generation = memory, task, generation
        if self.on_swap:
            self.on_swap(self)
        if old[0] is not None:
            # Callers that registered on the old shards before the swap hear from them.
            await old[0].drained(timeout=10)
            await self._stop(*old)
            log.info("qdrant_generation_switched", generation=generation)

    async def watch_generation(self) -> None:
        while True:
            await asyncio.sleep(1)
            gen = current_generation(self.settings)
            if gen != self.generation:
                await self.open(gen)

    @staticmethod
    async def _stop(memory: MemoryShards, task: asyncio.Task) -> None:
        memory.stop()
        try:
            await asyncio.wait_for(task, 5)
        except Exception:
            task.cancel()
        memory.close()

    async def close(self) -> None:
        if self.memory is not None:
            await self._stop(self.memory, self.task)


class Extension:
    """A feature served by the API process: its routes, and what it starts and stops.

    `start` runs after the memory service exists (app.state.service, app.state.keys).
    """

    router: Any = None

    async def start(self, app: FastAPI, settings: Settings) -> None: ...

    async def stop(self, app: FastAPI) -> None: ...


def extensions() -> list[Extension]:
    """The extensions every API process serves. Add new features here."""
    return [__import__("services.history_api", fromlist=["HistoryExtension"]).HistoryExtension()]


def build_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    exts = extensions()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await wait_for_broker(settings)
        await ensure_topics(settings)
        redis_client = connect_redis(settings.redis_url)
        await redis_client.ping()
        shards = ShardOwner(settings)
        await shards.open(current_generation(settings))
        prod = producer(settings)
        await prod.start()
        embedder = make_embedder(settings)
        await asyncio.to_thread(embedder.embed, ["warm up"])
        shards.embedder = shards.memory.embedder = embedder
        service = MemoryService(settings, RedisRecords(redis_client, namespace=settings.topic_prefix), shards.memory, embedder, prod)
        shards.on_swap = lambda owner: service.use_shards(owner.memory)
        watcher = asyncio.create_task(shards.watch_generation(), name="qdrant-generation-watch")
        app.state.service = service
        app.state.keys = KeyStore(redis_client, settings.operator_key, settings.redis_root)
        app.state.shards = shards
        app.state.health = HealthProbe(settings, redis_client)
        for ext in exts:
            await ext.start(app, settings)
        log.info("api_started", url=settings.api_url, model_configured=settings.model_configured)
        try:
            yield
        finally:
            for ext in reversed(exts):
                await ext.stop(app)
            watcher.cancel()
            await app.state.health.close()
            await shards.close()
            await prod.stop()
            await service.producer.stop()  # the service renews its producer after a failed send
            await redis_client.aclose()

    app = FastAPI(
        title="memlane",
        version="0.1.0",
        description="Event-sourced long-term memory for LLM agents.",
        lifespan=lifespan,
    )
    app.add_middleware(GuardBodies)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return JSONResponse({"error": {"code": e.code, "field": e.field, "message": e.message}}, status_code=e.status)

    @app.exception_handler(CursorError)
    async def _cursor(request: Request, e: CursorError):
        return JSONResponse({"error": {"code": "VALIDATION_FAILED", "field": "after", "message": f"after: {e}"}},
                            status_code=422)

    @app.exception_handler(ValidationError)
    async def _model_validation(request: Request, e: ValidationError):
        # Contract models validate again inside the service (e.g. the 512-byte summary limit).
        err = from_validation_error(e)
        return JSONResponse(
            {"error": {"code": "VALIDATION_FAILED", "field": err.field, "message": str(err)}}, status_code=422
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        err = e.errors()[0]
        loc = [str(p) for p in err["loc"] if p not in ("body", "query", "path", "header")]
        field = ".".join(loc)
        return JSONResponse(
            {"error": {"code": "VALIDATION_FAILED", "field": field, "message": f"{field}: {err['msg']}"}},
            status_code=422,
        )

    async def principal(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Principal:
        key = (authorization or "").removeprefix("Bearer ").strip()
        p = await request.app.state.keys.resolve(key)
        if p is None:
            raise ApiError("UNAUTHENTICATED", "authorization", "send 'Authorization: Bearer <api key>'", 401)
        return p

    def resolve_context(p: Principal, x_agent, x_tenant, x_session, x_preview, x_turn_ref=None, x_execution_id=None,
                        x_turn=None) -> Context:
        if p.role == "operator":
            if not x_agent or not (x_tenant or p.tenant != "*"):
                raise ApiError("VALIDATION_FAILED", "x-agent", "an operator key must name X-Tenant and X-Agent")
            tenant = x_tenant if p.tenant == "*" else p.tenant
            p = Principal(tenant, x_agent, "operator")
        elif x_agent and x_agent != p.agent:
            raise ApiError("FORBIDDEN", "x-agent", "this key belongs to another agent", 403)
        return Context(p, p.agent, x_session, x_preview, x_turn_ref, x_execution_id, x_turn)

    async def context(
        p: Annotated[Principal, Depends(principal)],
        x_agent: Annotated[str | None, Header()] = None,
        x_tenant: Annotated[str | None, Header()] = None,
        x_session: Annotated[str | None, Header()] = None,
        x_preview: Annotated[bool, Header()] = False,
        x_turn_ref: Annotated[str | None, Header()] = None,
        x_execution_id: Annotated[str | None, Header()] = None,
        x_turn: Annotated[int | None, Header(ge=0)] = None,
    ) -> Context:
        return resolve_context(p, x_agent, x_tenant, x_session, x_preview, x_turn_ref, x_execution_id, x_turn)

    Ctx = Annotated[Context, Depends(context)]

    def svc(request: Request) -> MemoryService:
        return request.app.state.service

    Svc = Annotated[MemoryService, Depends(svc)]

    @app.get("/health")
    async def health(request: Request):
        """"ok" (200) or "degraded" (503) with the problems: a registered worker without a
        heartbeat or too far behind, or this process's projections stopped."""
        shards = request.app.state.shards
        history = getattr(request.app.state, "history", None)
        tasks = {"memory projection": shards.task is not None and not shards.task.done()}
        if history is not None and history.task is not None:
            tasks["history projection"] = not history.task.done()
        workers, problems = assess(await request.app.state.health.observe(), settings.health_max_lag, tasks)
        body = {
            "status": "degraded" if problems else "ok",
            "problems": problems,
            "projection": {**shards.memory.status(), "generation": shards.generation},
            "workers": workers,
            "extraction": "on" if settings.model_configured else "off: no model configured (OPENAI_API_KEY / OPENAI_BASE_URL)",
        }
        return JSONResponse(body, status_code=503 if problems else 200)

    def tenant_operator(p: Principal, tenant: str | None, what: str) -> str:
        """The tenant an operator key administers: its own, or, for the bootstrap key, the one named."""
        if p.role != "operator":
            raise ApiError("FORBIDDEN", None, f"only an operator key can {what}", 403)
        if p.tenant == "*":
            if not tenant:
                raise ApiError("VALIDATION_FAILED", "tenant", f"tenant: name the tenant whose keys to {what.split()[0]}")
            return tenant
        if tenant not in (None, p.tenant):
            raise ApiError("FORBIDDEN", "tenant", f"only an operator key of this tenant can {what}", 403)
        return p.tenant

    @app.post("/v1/admin/keys", status_code=201)
    async def issue_key(body: KeyRequest, p: Annotated[Principal, Depends(principal)], request: Request):
        if p.role != "operator" or p.tenant not in ("*", body.tenant):
            raise ApiError("FORBIDDEN", None, "only an operator key of this tenant can issue keys", 403)
        if body.agent == WORKSPACE:
            raise ApiError("VALIDATION_FAILED", "agent", f"{WORKSPACE} holds workspace-wide blocks; it has no keys")
        if body.role != "operator" and body.agent is None:
            raise ApiError("VALIDATION_FAILED", "agent", f"agent: an {body.role} key speaks for one agent; name it")
        key, entry = await request.app.state.keys.issue(body.tenant, body.agent, body.role)
        return {"key": key, **entry}

    @app.get("/v1/admin/keys")
    async def list_keys(p: Annotated[Principal, Depends(principal)], request: Request,
                        tenant: Annotated[str | None, Query(max_length=128)] = None):
        """The tenant's keys: id, tenant, agent, role, created; never a key. The bootstrap
        operator key names the tenant; a tenant's operator key lists its own."""
        tenant = tenant_operator(p, tenant, "list keys")
        return {"keys": await request.app.state.keys.list(tenant)}

    @app.delete("/v1/admin/keys/{key_id}")
    async def revoke_key(key_id: Annotated[str, Path(max_length=64)], p: Annotated[Principal, Depends(principal)],
                         request: Request, tenant: Annotated[str | None, Query(max_length=128)] = None):
        """Revokes a key of the tenant by its id (from the list), at once."""
        tenant = tenant_operator(p, tenant, "revoke keys")
        entry = await request.app.state.keys.revoke(tenant, key_id)
        if entry is None:
            raise ApiError("NOT_FOUND", "key_id", f"no key {key_id} in this tenant; list them with GET /v1/admin/keys")
        return {"revoked": entry}

    @app.get("/v1/whoami")
    async def whoami(p: Annotated[Principal, Depends(principal)]):
        """The key's tenant, agent and role (what an MCP server offers depends on it)."""
        return {"tenant": p.tenant, "agent": p.agent, "role": p.role, "key_id": p.key_id}

    @app.put("/v1/config")
    async def put_config(config: AgentConfig, ctx: Ctx, s: Svc):
        return await s.configure(ctx, config)

    @app.get("/v1/config")
    async def get_config(ctx: Ctx, s: Svc):
        return (await s.config(ctx.tenant, ctx.agent)).model_dump(mode="json")

    @app.post("/v1/memory/search")
    async def search_memory(body: SearchRequest, ctx: Ctx, s: Svc):
        res = await s.search(ctx, **body.model_dump())
        await s.record_retrieved(ctx, "search_memory", [r for r, _ in res.records])
        return FastJSONResponse({"records": [record_out(r, sc) for r, sc in res.records], "next_cursor": res.next_cursor})

    @app.post("/v1/memory/search/batch")
    async def search_memory_batch(
        body: SearchBatchRequest,
        p: Annotated[Principal, Depends(principal)],
        s: Svc,
        x_agent: Annotated[str | None, Header()] = None,
        x_tenant: Annotated[str | None, Header()] = None,
        x_session: Annotated[str | None, Header()] = None,
        x_preview: Annotated[bool, Header()] = False,
    ):
        """Up to 100 searches in one request, each answered as `/v1/memory/search` would
        answer it alone (same key rules, same usage records), or with its own error.

        For callers that search for many contexts at once (the extraction worker): the
        queries share one embedding call, and the HTTP round trips collapse into one.
        """
        if not body.retrieved and p.role != "operator":
            raise ApiError("FORBIDDEN", "retrieved", "retrieved: only an operator key may set it to false", 403)
        searches: list[tuple[Context, dict[str, Any]]] = []
        answers: list[dict[str, Any] | None] = []
        for item in body.searches:
            try:
                ctx = resolve_context(
                    p,
                    item.agent or x_agent,
                    item.tenant or x_tenant,
                    item.session if item.session is not None else x_session,
                    item.preview if item.preview is not None else x_preview,
                )
            except ApiError as e:
                answers.append({"error": {"code": e.code, "field": e.field, "message": e.message}, "status": e.status})
                continue
            searches.append((ctx, item.model_dump(exclude={"tenant", "agent", "session", "preview"})))
            answers.append(None)
        results = iter(await s.search_many(searches))
        ctxs = iter(searches)
        for i, a in enumerate(answers):
            if a is not None:
                continue
            res, (ctx, _) = next(results), next(ctxs)
            if isinstance(res, ApiError):
                answers[i] = {"error": {"code": res.code, "field": res.field, "message": res.message}, "status": res.status}
                continue
            if body.retrieved:
                await s.record_retrieved(ctx, "search_memory", [r for r, _ in res.records])
            answers[i] = {"records": [record_out(r, sc) for r, sc in res.records], "next_cursor": res.next_cursor}
        return FastJSONResponse({"results": answers})

    @app.post("/v1/recall")
    async def recall(body: RecallRequest, ctx: Ctx, s: Svc):
        res = await s.recall(ctx, body.conversation, body.text)
        body_out = {
            "pinned": [{"id": r.id, "summary": r.summary, "version": r.version} for r in res.pinned],
            "records": [record_out(r, sc) for r, sc in res.records],
            "episodes": [record_out(r) for r in res.episodes],
            "procedures": [record_out(r) for r in res.procedures],
            "blocks": [{"scope": scope, "label": label, "text": text} for scope, label, text in res.blocks],
            "rendered": res.rendered,
        }
        return FastJSONResponse(body_out, headers={"Server-Timing": f"embed;dur={EMBED_MS.get():.2f}"})

    @app.post("/v1/memory/{rid}/outcome")
    async def report_outcome(rid: str, body: OutcomeRequest, ctx: Ctx, s: Svc, wait: bool = True):
        """Seed 002: the outcome of applying a procedure; its validations and successes or
        failures count up. An agent needs `report_outcome` in memory.tools."""
        return await s.report(ctx, rid, body.success, wait=wait)

    @app.get("/v1/blocks")
    async def list_blocks(ctx: Ctx, s: Svc):
        """Memory blocks (seed 002): labeled texts at the top of every recall."""
        return {"blocks": [{"scope": scope, "label": label, "text": text} for scope, label, text in await s.blocks(ctx)]}

    @app.post("/v1/blocks/{label}")
    async def curate_block(label: str, body: CurateRequest, ctx: Ctx, s: Svc, wait: bool = True,
                           scope: Literal["agent", "workspace"] = "agent"):
        """`add` a line, `replace` the line `old` with `line`, or `remove` the line `old`:
        an agent needs `curate_block` in memory.tools; a block holds at most 2,000 characters.
        `scope=workspace` (operator keys): a block every agent of the tenant recalls."""
        return await s.curate(ctx, label, body.action, body.line, body.old, scope=scope, wait=wait)

    @app.post("/v1/memory", status_code=201)
    async def add_memory(body: AddRequest, ctx: Ctx, s: Svc, wait: bool = True):
        return await s.add(ctx, wait=wait, **body.model_dump(exclude_none=True))

    @app.get("/v1/memory")
    async def list_memory(
        ctx: Ctx,
        s: Svc,
        first: Annotated[int, Query(ge=1, le=200)] = 20,
        after: str | None = None,
        sort: Literal["DESC", "ASC"] = "DESC",
    ):
        page = await s.memories(ctx, first, after, ascending=sort == "ASC")
        return {"records": [record_out(r) for r in page.records], "next_cursor": page.next_cursor}

    @app.get("/v1/memory/{rid}")
    async def read_memory(rid: str, ctx: Ctx, s: Svc, version: Annotated[int | None, Query(ge=1)] = None):
        return record_out(await s.read(ctx, rid, version))

    @app.get("/v1/memory/{rid}/history")
    async def memory_history(rid: str, ctx: Ctx, s: Svc):
        return {"versions": [record_out(r) for r in await s.history(ctx, rid)]}

    @app.delete("/v1/memory/{rid}")
    async def delete_memory(rid: str, ctx: Ctx, s: Svc, wait: bool = True):
        return await s.delete(ctx, rid, wait=wait)

    @app.patch("/v1/memory/{rid}")
    async def edit_memory(rid: str, body: EditRequest, ctx: Ctx, s: Svc, wait: bool = True):
        """Operator edit (seed 004): new text makes a successor; the same text changes nothing."""
        return await s.edit(ctx, rid, wait=wait, **body.model_dump(exclude_none=True))

    @app.post("/v1/memory/{rid}/pin")
    async def pin_memory(rid: str, ctx: Ctx, s: Svc):
        return await s.pin(ctx, rid, True)

    @app.delete("/v1/memory/{rid}/pin")
    async def unpin_memory(rid: str, ctx: Ctx, s: Svc):
        return await s.pin(ctx, rid, False)

    for ext in exts:
        if ext.router is not None:
            app.include_router(ext.router)
    return app
