"""Each process's own small HTTP server: `/metrics` (Prometheus), `/health` and `/ready`.

It runs on the process's event loop, so what it answers is what that loop sees: a loop
blocked for long answers nothing, which a prober takes for unhealthy, as it should.
`/ready` answers 200 only once the process serves what it should (docs/reference/metrics.md);
otherwise 503 with the reasons. A port taken by another process is logged and skipped:
metrics never stop a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from aiokafka import TopicPartition
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from workers.runtime import metrics

log = structlog.get_logger()

# A check returns the reasons the process is not ready (or not healthy): empty when it is.
Check = Callable[[], Awaitable[list[str]]]


def metrics_port(settings: Any, process: str) -> int:
    """MEMLANE_METRICS_PORT when set (0: no server), else the process's default."""
    if settings.metrics_port is not None:
        return settings.metrics_port
    return settings.metrics_port_base + metrics.PORT_INDEX.get(process, len(metrics.PORT_INDEX))


async def answer(process: str, check: Check, what: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of a /ready or /health check; sets `memlane_ready` for /ready."""
    try:
        reasons = await check()
    except Exception as e:  # a check that cannot look is a no
        reasons = [f"{what} check failed: {type(e).__name__}"]
    if what == "ready":
        metrics.READY.labels(process).set(0 if reasons else 1)
    ok = "ready" if what == "ready" else "ok"
    bad = "not_ready" if what == "ready" else "unhealthy"
    return (503 if reasons else 200), {"status": bad if reasons else ok, "process": process, "reasons": reasons}


class ProbeServer:
    def __init__(self, settings: Any, process: str, ready: Check, health: Check) -> None:
        self.settings, self.process = settings, process
        self.ready, self.health = ready, health
        self.runner: web.AppRunner | None = None
        self.port = metrics_port(settings, process)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _check(self, check: Check, what: str) -> web.Response:
        status, body = await answer(self.process, check, what)
        return web.json_response(body, status=status)

    async def start(self) -> None:
        if not self.port:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ready", lambda _: self._check(self.ready, "ready"))
        app.router.add_get("/health", lambda _: self._check(self.health, "health"))
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, self.settings.metrics_host, self.port).start()
        except OSError as e:
            log.warning("metrics_server_unavailable", port=self.port, error=f"{type(e).__name__}: {e}",
                        hint="set MEMLANE_METRICS_PORT to a free port, or 0")
            await self.runner.cleanup()
            self.runner = None
            return
        log.info("metrics_server_started", port=self.port, host=self.settings.metrics_host)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def sample_every(seconds: float, sample: Callable[[], Awaitable[None]]) -> None:
    """Runs `sample` every `seconds` until cancelled; a failed sample is logged and skipped."""
    while True:
        try:
            await sample()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.debug("metrics_sample_failed", error=f"{type(e).__name__}: {e}")
        await asyncio.sleep(seconds)


class WorkerProbe:
    """A worker's /health, /ready and periodic samples, read off its `workers.runtime.runner.Runner`."""

    def __init__(self, runner: Any, process: str) -> None:
        self.runner, self.process = runner, process
        self.lagging: set[tuple[str, str, str]] = set()  # label sets of `memlane_consumer_lag` set here

    async def health(self) -> list[str]:
        r = self.runner
        if r.stopping.is_set():
            return ["stopping"]
        if r.commit_error is not None:
            return [f"a commit failed ({type(r.commit_error).__name__}); the worker stops"]
        return []

    async def ready(self) -> list[str]:
        return [*await self.health(), *await self.runner.not_ready()]

    async def sample(self) -> None:
        """Consumer lag per partition (end offsets are one request), readiness, the processor's own."""
        r = self.runner
        c = r.consumer
        tps: set[TopicPartition] = set(c.assignment()) if c is not None else set()
        ends = await c.end_offsets(list(tps)) if tps else {}
        seen: set[tuple[str, str, str]] = set()
        for tp, end in ends.items():
            with contextlib.suppress(Exception):  # revoked meanwhile
                labels = (r.group, r._registry_name(tp.topic), str(tp.partition))
                metrics.CONSUMER_LAG.labels(*labels).set(max(0, end - await c.position(tp)))
                seen.add(labels)
        for labels in self.lagging - seen:
            with contextlib.suppress(KeyError):
                metrics.CONSUMER_LAG.remove(*labels)
        self.lagging = seen
        await answer(self.process, self.ready, "ready")
        await r.processor.sample(ends)

    async def serve(self, settings: Any, work: Awaitable[None]) -> None:
        """Runs `work` (the runner) with the probe server and the sampler beside it."""
        server = ProbeServer(settings, self.process, self.ready, self.health)
        await server.start()
        sampler = None
        if server.runner is not None:  # nobody scrapes a process without a server: no samples
            sampler = asyncio.create_task(sample_every(settings.metrics_every_s, self.sample), name="metrics-sampler")
        try:
            await work
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            await server.stop()
