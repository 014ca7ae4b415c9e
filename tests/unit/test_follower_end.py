"""A follower task of the API that fails says why in the log (services.http.following.report_end)."""

from __future__ import annotations

import asyncio

import structlog

from services.http.following import report_end


async def test_a_failed_follower_logs_its_task_and_cause_and_a_stopped_one_nothing():
    async def fails():
        raise AttributeError("'LeanRecord' object has no attribute 'x'")

    with structlog.testing.capture_logs() as logs:
        failed = asyncio.create_task(fails(), name="qdrant-projection-g1")
        failed.add_done_callback(report_end)
        stopped = asyncio.create_task(asyncio.sleep(3600), name="history-projection")
        stopped.add_done_callback(report_end)
        stopped.cancel()
        await asyncio.gather(failed, stopped, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run on the loop's next pass
    assert logs == [{"event": "follower_stopped", "task": "qdrant-projection-g1", "log_level": "error",
                     "error": "AttributeError: 'LeanRecord' object has no attribute 'x'"}]
