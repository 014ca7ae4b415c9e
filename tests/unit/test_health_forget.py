"""/health's probe has its own Redis client, and forgets a worker stopped for good."""

from __future__ import annotations

from services.http.health_probe import HealthProbe, forgotten
from settings import Settings
from tests.redis_at import redis_at


def test_a_worker_without_a_beat_past_the_bound_is_forgotten_and_an_untimed_one_starts_timing():
    seen = {"ledger": 1000.0, "history": 5000.0}
    drop, start = forgotten(["ledger", "history", "embedding"], seen, now=5000.0, bound_s=3600)
    assert drop == ["ledger"] and start == ["embedding"]
    assert forgotten(["ledger"], seen, now=4600.0, bound_s=3600) == ([], [])


async def test_the_probe_does_not_share_the_apis_connection_pool():
    probe = HealthProbe(Settings(), redis_at())
    try:
        pool = probe.r.connection_pool
        assert probe.r is not None and type(pool).__name__ == "ConnectionPool"
    finally:
        await probe.close()
