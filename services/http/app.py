"""The HTTP API's bootstrap (FastAPI; OpenAPI at /openapi.json, docs at /docs): what the process
starts and stops, and the routers it serves."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, cast

import structlog
from fastapi import APIRouter, FastAPI
from starlette.routing import Route

from events.topics import WEBHOOKS, WEBHOOKS_DEAD
from projections.embedders.choose import make_embedder
from projections.redis.api_key_view import ApiKeyView
from projections.redis.record_view import RedisRecords
from services.auth import KeyStore
from services.bootstrap import index_generations, keys_at, redis_at
from services.bootstrap import tracing as bootstrap_tracing
from services.http import errors
from services.http.health_probe import HealthProbe
from services.http.history_access import visible_messages
from services.http.input_guard import GuardBodies
from services.http.mcp_remote import RemoteMcp
from services.http.no_store import NoStore
from services.http.positions import Positions
from services.http.routes import agents, blocks, config, health, keys, memory, recall, search, subjects, whoami
from services.http.routes import export as export_routes
from services.http.routes import notes as notes_routes
from services.http.routes import profiles as profiles_routes
from services.http.routes import runs as runs_routes
from services.http.routes import tenant as tenant_routes
from services.http.routes import undo as undo_routes
from services.http.routes import webhooks as webhooks_routes
from services.http.routes.pipeline import router as pipeline_router
from services.http.shards import ShardOwner
from services.http.traced import Traced
from services.memory import MemoryService
from services.memory.kafka import KafkaCommandPublisher, KafkaUsageRecorder
from settings import Settings, get_settings
from workers.followers.api_keys_follower import ApiKeyLog
from workers.followers.memory_shards import MemoryShards
from workers.followers.past_index import PastIndexes
from workers.followers.past_memory import PastMemory
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics, producer, wait_for_broker
from workers.runtime.metrics import MeteredEmbedder

log = structlog.get_logger()

# The OpenAPI document lists the operations in this order.
ROUTERS: tuple[APIRouter, ...] = (
    health.router, keys.router, whoami.router, config.router, search.router, recall.router,
    blocks.router, memory.router, subjects.router, agents.router, pipeline_router, runs_routes.router,
    profiles_routes.router, tenant_routes.router)
# Notes (docs/features/notes.md), the portable export, and undo.
ROUTERS += (notes_routes.router, export_routes.router, undo_routes.router)
# Signed webhooks (docs/features/webhooks.md).
ROUTERS += (webhooks_routes.router,)


class Extension(Protocol):
    """A feature served by the API process: its routes, and what it starts and stops.

    `start` runs after the memory service exists (app.state.service, app.state.keys).
    """

    router: Any = None

    async def start(self, app: FastAPI, settings: Settings) -> None: ...

    async def stop(self, app: FastAPI) -> None: ...


def extensions() -> list[Extension]:
    """The extensions every API process serves. Add new features here."""
    from services.http.following import ActivityExtension
    from services.http.index_optimize import IndexOptimizer
    from services.http.readiness import ProbeExtension
    from services.http.routes.history import HistoryExtension

    # ProbeExtension last: /ready reads what the others started (the history projection).
    return [HistoryExtension(), ActivityExtension(), IndexOptimizer(), ProbeExtension()]


def build_app(settings: Settings | None = None, extra: Sequence[Extension] = ()) -> FastAPI:
    """The API; `extra`: features the bootstrap adds on top (the web page: services.cli)."""
    settings = settings or get_settings()
    exts = [*extensions(), *extra]
    tracing = bootstrap_tracing(settings, "api")
    remote_mcp = RemoteMcp(settings.api_url)  # the tools over MCP's HTTP transport, calling this API

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await wait_for_broker(settings)
        await ensure_topics(settings)
        await ensure_topics(settings, [WEBHOOKS, WEBHOOKS_DEAD])  # registrations are written here
        codec = keys_at(settings)()
        data_keys = await open_keys(settings, codec)
        redis = redis_at(settings)
        redis_client = redis(pooled=True)
        await redis_client.ping()
        # Read to the end before serving: the book answers for any key Redis has lost.
        api_keys = ApiKeyLog(settings, ApiKeyView(redis_client, settings.redis_root))
        await api_keys.start()
        # Metered (memlane_embedding_*, caller "api"): queries and healed points.
        embedder = MeteredEmbedder(make_embedder(settings), "api")
        await asyncio.to_thread(embedder.embed, ["warm up"])
        generations = index_generations(settings)
        shards = ShardOwner(settings, generations, redis, codec, embedder, data_keys, tracing)
        await shards.open(generations.current())
        assert shards.memory is not None  # `open` set it
        prod = producer(settings)
        await prod.start()
        publisher = KafkaCommandPublisher(settings, prod, codec, data_keys, tracing)
        records = RedisRecords(redis_client, namespace=settings.topic_prefix, keys=data_keys, codec=codec)
        # Notes check their sources as history reads them (docs/features/notes.md).
        past, past_indexes = PastMemory(settings, codec, data_keys), PastIndexes(settings.data_dir / "past")
        service = MemoryService(settings, records, shards.memory, embedder, publisher,
                                KafkaUsageRecorder(settings, publisher), visible=visible_messages,
                                past=past, past_indexes=past_indexes)
        # An owner calls `on_swap` once it holds its new shards.
        shards.on_swap = lambda owner: service.use_shards(cast(MemoryShards, owner.memory))
        watcher = asyncio.create_task(shards.watch_generation(), name="qdrant-generation-watch")
        app.state.settings = settings
        app.state.redis_at = redis  # for the extensions' own clients
        app.state.producer = prod  # the webhook routes' registrations and replays
        app.state.codec = codec  # the process's: the extensions' followers seal and open with it
        app.state.service = service
        app.state.keys = KeyStore(redis_client, settings.operator_key, settings.redis_root, log=api_keys)
        app.state.api_keys = api_keys
        app.state.shards = shards
        app.state.data_keys = data_keys  # workers.runtime.data_keys.KeyTopic: the data keys, None with encryption off
        app.state.health = HealthProbe(settings, redis)  # its own Redis client: see HealthProbe
        for ext in exts:
            await ext.start(app, settings)
        log.info("api_started", url=settings.api_url, model_configured=settings.model_configured)
        try:
            yield
        finally:
            for ext in reversed(exts):
                await ext.stop(app)
            watcher.cancel()
            await service.fair.aclose()
            await api_keys.stop()
            await app.state.health.close()
            await shards.close()
            await past.aclose()
            past_indexes.close()
            await prod.stop()
            await publisher.stop()  # the publisher renews its producer after a failed send
            await remote_mcp.aclose()
            await records.aclose()  # its applied-listener, then the Redis client everything here shares
            if data_keys is not None:
                await data_keys.stop()
            tracing.shutdown()

    app = FastAPI(
        title="memlane",
        version="0.1.0",
        description="Event-sourced long-term memory for LLM agents.",
        lifespan=lifespan,
    )
    app.add_middleware(GuardBodies)
    app.add_middleware(Positions)
    app.add_middleware(NoStore)
    if tracing.enabled:  # outermost: the span covers the whole request
        app.add_middleware(Traced, tracing=tracing)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    for ext in exts:
        if ext.router is not None:
            app.include_router(ext.router)
    app.router.routes.append(Route("/mcp", endpoint=remote_mcp, methods=["GET", "POST", "DELETE"],
                                   include_in_schema=False))
    return app
