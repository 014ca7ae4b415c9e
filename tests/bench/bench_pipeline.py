"""pipeline: from producing a turn to the API finding its record (e2e_turn_to_searchable_ms)."""

from __future__ import annotations

import asyncio
import time
import uuid

from events import AgentConfig
from services.client import MemlaneClient, TurnPublisher
from tests.bench.common import bench_stack, figure, median, percentile, progress
from tests.e2e.test_skeleton import committed_turn

TURNS = 25


async def run() -> None:
    with bench_stack("pipeline") as (stack, settings):
        tenant, agent = "bench", f"a{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(AgentConfig())
        lat: list[float] = []
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub, MemlaneClient(
            stack.api_url, key, session="s1"
        ) as c:
            for n in range(TURNS + 3):
                word = f"marker{uuid.uuid4().hex[:10]}"
                t0 = time.perf_counter()
                await pub.publish(committed_turn(tenant, agent, "s1", n, f"The code word for turn {n} is {word}"))
                while True:
                    hits, _ = await c.search_memory(word, mode="lexical", limit=1)
                    if hits:
                        break
                    await asyncio.sleep(0.005)
                if n >= 3:  # the first turns warm connections and caches
                    lat.append((time.perf_counter() - t0) * 1000)
                progress(f"turn {n}: {lat[-1] if lat else 0:.0f} ms")
        figure("e2e_turn_to_searchable_ms_p50", median(lat), "ms", len(lat))
        figure("e2e_turn_to_searchable_ms_p95", percentile(lat, 95), "ms", len(lat))
