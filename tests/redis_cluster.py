"""The Redis Cluster a test session runs against with MEMLANE_TEST_REDIS=cluster (started by
`deploy/local/redis-cluster.sh start`, which `make test` runs first)."""

from __future__ import annotations

import os

import pytest

PORTS = os.environ.get("MEMLANE_REDIS_CLUSTER_PORTS", "16380 16381 16382").split()


def selected() -> bool:
    return os.environ.get("MEMLANE_TEST_REDIS") == "cluster"


def cluster_env() -> dict[str, str]:
    """Environment overrides that point every client at the cluster; fails the session when
    the cluster is not up and serving every slot."""
    import redis

    url = f"redis://127.0.0.1:{PORTS[0]}/0"
    try:
        r = redis.Redis.from_url(url, socket_timeout=5)
        state = r.execute_command("CLUSTER INFO")
        r.close()
    except redis.RedisError as e:
        pytest.fail(f"no Redis Cluster at {url} ({e}): run `deploy/local/redis-cluster.sh start`")
    if (state.get("cluster_state") if isinstance(state, dict) else None) != "ok":
        pytest.fail(f"the Redis Cluster at {url} is not ok: {state}")
    return {"REDIS_URL": url, "MEMLANE_REDIS_CLUSTER": "1"}
