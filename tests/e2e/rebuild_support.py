"""`memlane rebuild --target redis` for the e2e tests that check a view comes back from the log."""

from __future__ import annotations

import subprocess
import sys

from projections.redis.record_view import RedisRecords


async def rebuilt_redis(stack, store: RedisRecords) -> int:
    """Rebuilds the Redis view of `stack` from the log alone and switches to it: the new
    generation (`store` names the live one), which must be past the one before."""
    before = await store.generation()
    proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild", "--target", "redis"], env=stack.env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = await store.generation()
    assert after > before
    return after
