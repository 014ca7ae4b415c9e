"""Health: "ok" (200) or "degraded" (503) with the problems."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.http.health_probe import assess
from services.http.readiness import not_ready
from workers.runtime import metrics

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """"ok" (200) or "degraded" (503) with the problems: a registered worker without a
    heartbeat or too far behind, or this process's projections stopped."""
    settings = request.app.state.settings
    shards = request.app.state.shards
    history = getattr(request.app.state, "history", None)
    tasks = {"memory projection": shards.task is not None and not shards.task.done()}
    if history is not None and history.task is not None:
        tasks["history projection"] = not history.task.done()
    activity = getattr(request.app.state, "activity_follower", None)
    if activity is not None:
        tasks["activity follower"] = activity.running
    api_keys = getattr(request.app.state, "api_keys", None)
    if api_keys is not None:
        tasks["api key follower"] = api_keys.running
    workers, problems = assess(await request.app.state.health.observe(), settings.health_max_lag, tasks)
    body = {
        "status": "degraded" if problems else "ok",
        "problems": problems,
        "projection": {**shards.memory.status(), "generation": shards.generation},
        "workers": workers,
        "extraction": "on" if settings.model_configured else "off: no model configured (OPENAI_API_KEY / OPENAI_BASE_URL)",
    }
    return JSONResponse(body, status_code=503 if problems else 200)


@router.get("/ready")
async def ready(request: Request):
    """"ready" (200) once this process serves what it should: its memory projection (every shard of
    the generation served) and its history projection caught up with the log; else "not_ready"
    (503) with the reasons. Unlike /health, it says nothing of the workers (docs/reference/metrics.md)."""
    reasons = not_ready(request.app)
    metrics.READY.labels("api").set(0 if reasons else 1)
    return JSONResponse({"status": "not_ready" if reasons else "ready", "process": "api", "reasons": reasons},
                        status_code=503 if reasons else 200)
