"""The tests' Redis: the composition root's connector for a URL (the settings' by default),
a cluster client when the settings say so (the suite's Redis Cluster run)."""

from __future__ import annotations

from services.bootstrap import RedisAt
from settings import Settings


def redis_at(url: str | None = None, cluster: bool | None = None) -> RedisAt:
    s = Settings()
    return RedisAt(url or s.redis_url, s.redis_cluster if cluster is None else cluster)
