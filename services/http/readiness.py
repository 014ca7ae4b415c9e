"""The API process's readiness and metrics (docs/reference/metrics.md).

`GET /metrics` on the API's own port, and the process's metrics port (MEMLANE_METRICS_PORT,
default 39100) with `/metrics`, `/health` and `/ready` like every worker's. `not_ready` is
what `GET /ready` answers with: the memory projection (every shard of the generation served)
and the history projection caught up with the log. A rebuilt generation is only switched to
once its shards have caught up (`ShardOwner.open`), so a swap keeps the process ready.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import TopicPartition
from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from events.topics import EVENTS, TURNS
from settings import Settings
from workers.runtime import metrics
from workers.runtime.kafka_io import reader
from workers.runtime.probe import ProbeServer, answer, sample_every
from workers.runtime.topic_reader import tp_key

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics_route() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def not_ready(app: FastAPI) -> list[str]:
    """Why the API does not serve what it should yet; empty when ready."""
    reasons: list[str] = []
    shards = getattr(app.state, "shards", None)
    if shards is None or shards.memory is None:
        return ["starting"]
    if shards.task is None or shards.task.done():
        reasons.append("memory projection stopped")
    else:
        behind = [i for i, p in enumerate(shards.memory.projections) if not p.caught_up.is_set()]
        if behind:
            reasons.append(f"memory projection catching up (generation {shards.generation}, shards {behind} of "
                           f"{len(shards.memory.projections)})")
    history = getattr(app.state, "history", None)
    if history is not None and history.projection is not None:
        if history.task is None or history.task.done():
            reasons.append("history projection stopped")
        elif not history.projection.caught_up.is_set():
            reasons.append("history projection catching up")
    return reasons


async def _not_ready(app: FastAPI) -> list[str]:
    return not_ready(app)


async def _alive() -> list[str]:
    return []


class ProbeExtension:
    """Serves /metrics, runs the process's metrics server and samples the projections' gauges."""

    router = router

    def __init__(self) -> None:
        self.server: ProbeServer | None = None
        self.sampler: asyncio.Task | None = None
        self.ends: Any = None  # a group-less consumer, for end offsets
        self.applied: dict[str, int] = {}

    async def start(self, app: FastAPI, settings: Settings) -> None:
        self.app, self.settings = app, settings
        self.server = ProbeServer(settings, "api", lambda: _not_ready(app), _alive)
        await self.server.start()
        self.ends = reader(settings)
        await self.ends.start()
        self.sampler = asyncio.create_task(sample_every(settings.metrics_every_s, self.sample), name="api-metrics")

    async def stop(self, app: FastAPI) -> None:
        if self.sampler is not None:
            self.sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sampler
        if self.ends is not None:
            await self.ends.stop()
        if self.server is not None:
            await self.server.stop()

    def _applied(self, projection: str, total: int) -> None:
        """A projection's `applied` count, which restarts with a generation, as a counter."""
        last = self.applied.get(projection, 0)
        metrics.PROJECTION_APPLIED.labels(projection).inc(total - last if total >= last else total)
        self.applied[projection] = total

    async def sample(self) -> None:
        s, app = self.settings, self.app
        events = [TopicPartition(s.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        turns = [TopicPartition(s.topic(TURNS.name), p) for p in range(TURNS.partitions)]
        end = await self.ends.end_offsets(events + turns)

        def lag(ckpt: dict[str, int], tps: list[TopicPartition]) -> int:
            return sum(max(0, end[tp] - ckpt.get(tp_key(tp), 0)) for tp in tps)

        shards = app.state.shards
        memory = shards.memory
        if memory is not None:
            metrics.PROJECTION_GENERATION.labels("memory").set(shards.generation)
            metrics.PROJECTION_POINTS.labels("memory").set(sum(p.index.count() for p in memory.projections))
            metrics.PROJECTION_CHECKPOINT_LAG.labels("memory").set(sum(
                lag(p.ckpt, [tp for tp in events if tp.partition in p.partitions]) for p in memory.projections))
            self._applied("memory", sum(p.applied for p in memory.projections))
        history = getattr(app.state, "history", None)
        if history is not None and history.projection is not None:
            h = history.projection
            metrics.PROJECTION_GENERATION.labels("history").set(1)  # one generation (workers.followers.history_qdrant)
            metrics.PROJECTION_POINTS.labels("history").set(h.index.count())
            metrics.PROJECTION_CHECKPOINT_LAG.labels("history").set(lag(h.ckpt, events + turns))
            self._applied("history", h.turns)
        await answer("api", lambda: _not_ready(app), "ready")
