"""The folds of the log this API process runs beside its routes, as extensions of the app
(services/http/app.py, `extensions()`).

`ActivityExtension` runs the activity follower and serves its view as `app.state.activity`
(projections.redis.activity_view.ActivityView: `series` for the chart of the last hour,
`recalls_of` for a record's recalls); the pipeline status and the Memory tab read it.
`HistoryFollowing` runs session history's index: the Edge shard, the projection that folds turns
and their parts' vectors into it, and the Redis side's reader; the history routes search it.
"""

from __future__ import annotations

import asyncio

import structlog
from fastapi import FastAPI

from projections.qdrant.history_index import HistoryIndex
from projections.redis.activity_view import ActivityView
from projections.redis.history_view import RedisHistory
from settings import Settings
from workers.followers.activity_follower import ActivityFollower
from workers.followers.history_qdrant import HistoryQdrantProjection, history_shard_path

log = structlog.get_logger()


class ActivityExtension:
    router = None

    def __init__(self) -> None:
        self.view: ActivityView | None = None
        self.follower: ActivityFollower | None = None
        self.task: asyncio.Task | None = None

    async def start(self, app: FastAPI, settings: Settings) -> None:
        # Its own Redis client, as the health probe has: a burst of chart reads never waits
        # behind the memory service's pool, nor the other way round.
        self.view = ActivityView(app.state.redis_at(), settings.redis_root)
        self.follower = ActivityFollower(settings, self.view, getattr(app.state, "data_keys", None), codec=app.state.codec)
        self.task = asyncio.create_task(self.follower.run(), name="activity-follower")
        self.task.add_done_callback(report_end)
        app.state.activity = self.view
        app.state.activity_follower = self

    async def stop(self, app: FastAPI) -> None:
        if self.follower and self.task:
            self.follower.stopping.set()
            done, _ = await asyncio.wait({self.task}, timeout=5)
            if not done:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
        if self.view:
            await self.view.aclose()

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


def report_end(task: asyncio.Task) -> None:
    """A done callback for a follower's task: an ended follower shows in /health, and the cause
    of one that failed belongs in the log (the error's type and message, never a payload)."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.error("follower_stopped", task=task.get_name(), error=f"{type(err).__name__}: {err}")


class HistoryFollowing:
    """Session history's index in this process, started and stopped with the app."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        keys = getattr(app.state, "data_keys", None)  # None with encryption off
        self.index = HistoryIndex(history_shard_path(settings), cipher=app.state.codec.cipher)
        self.projection = HistoryQdrantProjection(settings, self.index, keys, codec=app.state.codec)  # it never embeds: vectors come joined
        self.task = asyncio.create_task(self.projection.run(), name="history-projection")
        self.task.add_done_callback(report_end)
        self.store = RedisHistory(app.state.redis_at(), settings.topic_prefix, keys=keys, codec=app.state.codec)

    async def stop(self) -> None:
        self.projection.stopping.set()
        try:
            await asyncio.wait_for(self.task, 5)
        except Exception:
            self.task.cancel()
        self.index.close()
        await self.store.aclose()
