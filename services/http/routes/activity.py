"""The activity view's extension (services/http/app.py, `extensions()`): runs its follower in
this process and serves the view as `app.state.activity` (projections.redis.activity_view.ActivityView:
`series` for the chart of the last hour, `recalls_of` for a record's recalls). It adds no
route of its own: the pipeline status (routes/pipeline.py) and the Memory tab read the view.
"""

from __future__ import annotations

import asyncio

import structlog
from fastapi import FastAPI

from projections.redis.activity_view import ActivityView
from settings import Settings
from workers.followers.activity_follower import ActivityFollower

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
        self.follower = ActivityFollower(settings, self.view, getattr(app.state, "data_keys", None))
        self.task = asyncio.create_task(self.follower.run(), name="activity-follower")
        self.task.add_done_callback(_report)
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


def _report(task: asyncio.Task) -> None:
    # An ended follower shows in /health; its cause belongs in the log.
    if not task.cancelled() and task.exception() is not None:
        log.error("activity_follower_stopped", error=f"{type(task.exception()).__name__}: {task.exception()}")
