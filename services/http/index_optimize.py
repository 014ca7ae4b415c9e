"""The index optimise policy, run by the API process that owns the memory shards.

Every `optimize_check_s` it reads each shard's unindexed points (`workers.jobs.optimize_policy`);
once one has `optimize_unindexed_points` more than its last optimise left, it takes a Redis
lock and runs `memlane rebuild --target qdrant --optimize` as a child process: a new
generation, folded from the log and optimised beside the live one, which the shard owner's
watcher swaps to (`services.http.shards`). Searches never wait on it. Why this process, and
why a child: docs/operations/scheduled-jobs.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from typing import Any

import structlog

from settings import Settings
from settings.environment import child_environment
from workers.jobs.optimize_policy import optimize_due, read_left, shard_unindexed
from workers.runtime.metrics import OPTIMIZE_CHECKS, OPTIMIZE_LAST_SECONDS, OPTIMIZE_RUNS, UNINDEXED_POINTS

log = structlog.get_logger()

# Extends the lock while its token is still ours; releases it the same way.
_EXTEND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def lock_key(settings: Settings) -> str:
    return f"{settings.redis_root}optimize:lock"


def rebuild_env(settings: Settings) -> dict[str, str]:
    """The child's environment: this process's, with the settings the rebuild reads made
    explicit (an app built with settings of its own, as tests do, has them nowhere else)."""
    return child_environment(**{
        "MEMLANE_DATA_DIR": str(settings.data_dir),
        "MEMLANE_TOPIC_PREFIX": settings.topic_prefix,
        "MEMLANE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "REDIS_URL": settings.redis_url,
        "MEMLANE_MEMORY_SHARDS": str(settings.memory_shards),
        "MEMLANE_KEY_FILE": str(settings.key_file),
        "MEMLANE_ENCRYPTION": "true" if settings.encryption else "false",
        "MEMLANE_METRICS_PORT": "0",  # the API's port is this process's
    })


class IndexOptimizer:
    """An API extension (`services.http.app.Extension`): starts the policy's loop."""

    router = None

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.child: asyncio.subprocess.Process | None = None
        self.redis: Any = None
        self.settings: Settings | None = None
        self.owner: Any = None

    async def start(self, app: Any, settings: Settings) -> None:
        if settings.optimize_unindexed_points <= 0 or settings.qdrant_client_mode:
            return  # a Qdrant server optimises its collections itself (docs/operations/qdrant-server.md)
        self.settings, self.owner = settings, app.state.shards
        self.redis = app.state.redis_at(pooled=True)
        self.task = asyncio.create_task(self.run(), name="index-optimize")

    async def stop(self, app: Any) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self._end_child()
        if self.redis is not None:
            await self.redis.aclose()

    async def run(self) -> None:
        assert self.settings is not None  # `start` set it before starting this loop
        while True:
            await asyncio.sleep(self.settings.optimize_check_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis restarting, a shard swapped under the check: next time
                log.warning("index_optimize_check_failed", error=f"{type(e).__name__}: {e}")
            OPTIMIZE_CHECKS.inc()  # counted once the look is over: a test waits for looks after a point

    def unindexed(self) -> tuple[list[int], list[int]] | None:
        """(unindexed, left by the last optimise) per shard of the served generation, or None
        while it is not the current one or is still catching up."""
        assert self.settings is not None  # only the loop `start` began checks
        memory = self.owner.memory
        if memory is None or self.owner.generations.current() != memory.generation:
            return None  # a new generation is waiting to be swapped to
        if not all(p.caught_up.is_set() for p in memory.projections):
            return None
        unindexed = [shard_unindexed(p.index) for p in memory.projections]
        for k, n in enumerate(unindexed):
            UNINDEXED_POINTS.labels(str(k)).set(n)
        return unindexed, [read_left(p.index.path) for p in memory.projections]

    async def check(self) -> bool:
        """Starts an optimise when one is due and no process runs one; True when it ran one."""
        assert self.settings is not None  # only the loop `start` began checks
        seen = self.unindexed()
        if seen is None or not optimize_due(*seen, self.settings.optimize_unindexed_points):
            return False
        token, key = uuid.uuid4().hex, lock_key(self.settings)
        lock_ms = int(self.settings.optimize_lock_s * 1000)
        if not await self.redis.set(key, token, nx=True, px=lock_ms):
            return False  # another process runs one
        try:
            if (seen := self.unindexed()) is None or not optimize_due(*seen, self.settings.optimize_unindexed_points):
                return False  # another process's optimise was swapped to meanwhile
            extending = asyncio.create_task(self._extend(key, token, lock_ms))
            try:
                await self._optimize(seen)
            finally:
                extending.cancel()
                await asyncio.gather(extending, return_exceptions=True)
            return True
        finally:
            with contextlib.suppress(Exception):
                await self.redis.eval(_RELEASE, 1, key, token)

    async def _extend(self, key: str, token: str, lock_ms: int) -> None:
        while True:
            await asyncio.sleep(lock_ms / 3000)
            with contextlib.suppress(Exception):
                await self.redis.eval(_EXTEND, 1, key, token, lock_ms)

    async def _optimize(self, seen: tuple[list[int], list[int]]) -> None:
        assert self.settings is not None  # called by `check`
        gen = self.owner.generation
        log.info("index_optimize_started", generation=gen, unindexed=seen[0], left=seen[1],
                 threshold=self.settings.optimize_unindexed_points)
        t0 = time.monotonic()
        child = self.child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.cli", "rebuild", "--target", "qdrant", "--optimize",
            env=rebuild_env(self.settings), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        )
        rc = await child.wait()  # cancelled (the API stopping): `stop` ends the child
        self.child = None
        seconds = time.monotonic() - t0
        if rc == 0:
            OPTIMIZE_RUNS.labels("ok").inc()
            OPTIMIZE_LAST_SECONDS.set(seconds)
            log.info("index_optimize_done", previous=gen, generation=self.owner.generations.current(),
                     seconds=round(seconds, 2))
        else:
            OPTIMIZE_RUNS.labels("failed").inc()
            log.warning("index_optimize_failed", generation=gen, exit_code=rc, seconds=round(seconds, 2))

    async def _end_child(self) -> None:
        """A rebuild still running when the API stops is stopped: its generation is not
        switched to, and the next optimise starts that generation again from scratch."""
        child = self.child
        if child is None or child.returncode is not None:
            return
        child.terminate()
        try:
            await asyncio.wait_for(child.wait(), timeout=5)
        except TimeoutError:
            child.kill()
            await child.wait()
