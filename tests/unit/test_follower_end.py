"""A follower task of the API that fails says why in the log (services.http.following.report_end)."""

from __future__ import annotations

import asyncio

import structlog

from services.http.following import report_end


async def test_a_failed_follower_logs_its_task_and_cause_and_a_stopped_one_nothing():
    async def fails():
        raise AttributeError("'LeanRecord' object has no attribute 'x'")

    reported: list[asyncio.Task] = []
    both_reported = asyncio.Event()

    def seen(task: asyncio.Task) -> None:  # runs after `report_end`: callbacks run in the order added
        reported.append(task)
        if len(reported) == 2:
            both_reported.set()

    with structlog.testing.capture_logs() as logs:
        failed = asyncio.create_task(fails(), name="qdrant-projection-g1")
        stopped = asyncio.create_task(asyncio.Event().wait(), name="history-projection")
        for task in (failed, stopped):
            task.add_done_callback(report_end)
            task.add_done_callback(seen)
        stopped.cancel()
        await asyncio.wait_for(both_reported.wait(), 5)
    assert logs == [{"event": "follower_stopped", "task": "qdrant-projection-g1", "log_level": "error",
                     "error": "AttributeError: 'LeanRecord' object has no attribute 'x'"}]
