"""The expiry sweep: one `SweepExpired` command per agent, decided by the ledger.

Run it nightly (`memlane sweep`). Reads stop serving expired records at once; the sweep
turns them into tombstones in the log, so history and rebuilds show when they went.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from events import SweepExpired, encode
from events.record import Provenance, Source
from events.topics import COMMANDS
from projections.redis_records import RedisRecords
from services.settings import Settings
from workers.kafka_io import producer


async def sweep(settings: Settings, at: datetime, progress: Callable[[int, int], None] | None = None) -> int:
    """Sends a sweep as of `at` for every known agent; returns how many were sent.

    The command id names the agent and the time, so running the same sweep twice sends
    the same commands, and the ledger decides them the same way."""
    store = RedisRecords.from_url(settings.redis_url, namespace=settings.topic_prefix)
    try:
        agents = await store.agents()
    finally:
        await store.aclose()
    p = producer(settings)
    await p.start()
    try:
        stamp = at.strftime("%Y%m%dT%H%M%SZ")
        for i, (tenant, agent) in enumerate(agents, 1):
            cmd = SweepExpired(
                command_id=f"sweep:{tenant}:{agent}:{stamp}",
                tenant=tenant,
                agent=agent,
                issued_at=at,
                provenance=Provenance(source=Source.OPERATOR, modified_by="sweep"),
            )
            await p.send(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
            if progress:
                progress(i, len(agents))
        await p.flush()
    finally:
        await p.stop()
    return len(agents)
