"""The expiry sweep: the Redis projection's expiry index names the candidates, the
ledger decides, one `SweepExpired` command per agent and batch of ids.

Run it nightly (`memlane sweep`). Reads stop serving expired records at once; the sweep
turns them into tombstones in the log, so history and rebuilds show when they went.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from events import SweepExpired, encode
from events.record import Provenance, Source
from events.topics import COMMANDS
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from settings import Settings
from workers.runtime.kafka_io import producer

BATCH = 500


async def sweep(settings: Settings, redis: Connect, at: datetime,
                progress: Callable[[int, int], None] | None = None) -> int:
    """Sends sweeps as of `at` for every record the index says has expired; returns how
    many records were named. A command id names the agent, the time and the batch's first
    id, so running the same sweep twice sends the same commands."""
    store = RedisRecords(redis(pooled=True), namespace=settings.topic_prefix)
    try:
        expired = await store.expired(int(at.timestamp() * 1000))
    finally:
        await store.aclose()
    total, done = sum(len(ids) for ids in expired.values()), 0
    p = producer(settings)
    await p.start()
    try:
        stamp = at.strftime("%Y%m%dT%H%M%SZ")
        for (tenant, agent), ids in sorted(expired.items()):
            for i in range(0, len(ids), BATCH):
                chunk = sorted(ids)[i : i + BATCH]
                cmd = SweepExpired(
                    command_id=f"sweep:{stamp}:{tenant}:{agent}:{chunk[0]}",
                    tenant=tenant,
                    agent=agent,
                    issued_at=at,
                    record_ids=chunk,
                    provenance=Provenance(source=Source.OPERATOR, modified_by="sweep"),
                )
                await p.send(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
                done += len(chunk)
                if progress:
                    progress(done, total)
        await p.flush()
    finally:
        await p.stop()
    return total
