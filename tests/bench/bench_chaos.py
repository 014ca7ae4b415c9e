"""`make bench ONLY=chaos`: kill -9 each process during a write burst, and fuzz the API.

Figures per process killed: `chaos_acked_lost` (acknowledged writes never readable, plus
those readable twice) and `chaos_acked_unsearchable` (readable, never found by search, plus
acknowledged turns missing from history). Both must be 0. Then `fuzz_requests` and
`fuzz_5xx` (must be 0): schemathesis and hostile values against every operation.
"""

from __future__ import annotations

import asyncio

from settings import Settings
from tests.bench.common import bench_stack, figure, progress
from tests.e2e.chaos_support import VICTIMS, chaos_round
from tests.e2e.fuzz_support import run_fuzz

WRITES, TURNS = 400, 100


async def run() -> None:
    with bench_stack("chaos") as (stack, settings):
        for victim in VICTIMS:
            res = await chaos_round(stack, Settings().operator_key, settings.kafka_bootstrap, settings.topic_prefix,
                                    victim, writes=WRITES, turns=TURNS, progress=progress)
            # The burst did its work: most writes were acknowledged, and every turn.
            assert res.writes_acked >= WRITES * 0.9 and res.turns_acked == TURNS, res
            progress(f"chaos {victim}: {res.acked} acknowledged in {res.seconds:.1f} s")
            extra = dict(victim=victim, writes_acked=res.writes_acked, turns_acked=res.turns_acked)
            figure("chaos_acked_lost", len(res.lost) + len(res.duplicated), "writes", res.acked, **extra,
                   duplicated=len(res.duplicated))
            figure("chaos_acked_unsearchable", len(res.unsearchable) + len(res.history_missing), "writes", res.acked,
                   **extra, history_missing=len(res.history_missing))
        progress("fuzzing every operation")
        counts = await asyncio.to_thread(run_fuzz, stack.api_url, Settings().operator_key, 100, 100)
        assert counts.requests >= 1000, counts.as_figures()  # the fuzz ran, not only its setup
        figure("fuzz_requests", counts.requests, "requests", counts.requests)
        figure("fuzz_5xx", counts.server_errors, "responses", counts.requests)
