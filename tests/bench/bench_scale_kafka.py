"""Kafka with replication: kill -9 one broker of a 3-node cluster during a burst of turns.

Starts `deploy/local/kafka-cluster.sh` (RF 3, min.insync.replicas 2), runs the pipeline on it
with the same replication, publishes TURNS turns (each one `add_memory` call), kills the active
controller (a leader of event partitions too) halfway, and counts, against the event log read
back from the surviving brokers and its pure fold:

- `broker_kill_lost`: turns without their record (in Redis or in the log). Must be 0.
- `broker_kill_duplicated`: turns with more than one record, plus events logged twice without
  the redelivery mark, plus records where Redis and the fold disagree. Must be 0.
- `broker_kill_burst_s`: first turn published to every record listed in Redis.
- `broker_kill_pause_s`: the longest the event log went without a new event (the failover).

Not in `make bench`'s groups; run with `.venv/bin/python -c "import asyncio, tests.bench.bench_scale_kafka as b; asyncio.run(b.run())"`.
"""

from __future__ import annotations

import shutil
import time
import uuid

from settings import ROOT, Settings
from tests.bench.common import figure, progress
from tests.e2e.broker_kill_support import WORKERS, Cluster, broker_kill_round, cluster_stack

TURNS = 500


async def run() -> None:
    cluster = Cluster()
    t0 = time.monotonic()
    bootstrap = cluster.start()
    progress(f"3-node cluster up in {time.monotonic() - t0:.1f} s: {bootstrap}")
    run_id = f"benchscalekafka{uuid.uuid4().hex[:6]}"
    data = ROOT / ".run" / run_id
    stack = cluster_stack(bootstrap, f"{run_id}.", data, {})
    done = False
    try:
        t0 = time.monotonic()
        stack.start_all(WORKERS)
        progress(f"stack up in {time.monotonic() - t0:.1f} s (logs: {stack.log_dir})")
        res = await broker_kill_round(cluster, bootstrap, stack, Settings().redis_url, turns=TURNS, agents=5,
                                      settle_s=180, progress=progress)
        # Counted, not assumed: every turn was acknowledged, and "none lost" agrees with the
        # records counted in Redis and in the log.
        assert res.acked == TURNS, res
        assert (not res.lost) == (res.records == res.logged == TURNS), res
        assert res.victim_led, f"node {res.victim} led no event partition: {res}"
        progress(f"{res.records} of {TURNS} records in Redis ({res.logged} in the log) in {res.burst_s:.1f} s; "
                 f"log paused {res.pause_s:.1f} s")
        extra = dict(victim=res.victim, victim_led=res.victim_led, events_at_kill=res.events_at_kill)
        figure("broker_kill_lost", len(res.lost), "turns", TURNS, **extra)
        figure("broker_kill_duplicated", len(res.duplicated) + len(res.doubled_events) + len(res.view_differs),
               "turns", TURNS, **extra, doubled_events=len(res.doubled_events), view_differs=len(res.view_differs),
               redelivered=res.redelivered)
        figure("broker_kill_burst_s", res.burst_s, "s", TURNS, **extra)
        figure("broker_kill_pause_s", res.pause_s, "s", TURNS, **extra)
        done = True
    finally:
        stack.stop()
        if done:  # a failed run keeps its logs to read
            shutil.rmtree(data, ignore_errors=True)
        cluster.clean()
