"""`make bench ONLY=fairness`: one tenant's searches while another floods the API.

`fairness_victim_search_ms_p95` (and p50): a victim tenant's single searches (one-line queries,
hybrid, so each is embedded) alone, then while a hostile tenant keeps four connections busy with
100-item batch searches of 4,000-character queries; printed for both phases with their ratio.
Every victim search must find its fact and the hostile tenant must have had batches answered
(and counts its 429s) before a figure prints.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from events import AgentConfig
from settings import Settings
from tests.bench.bench_writes import new_agent
from tests.bench.common import bench_stack, figure, percentile, progress

SEARCHES, HOSTILE_CONNECTIONS, BATCH, QUERY_CHARS = 150, 4, 100, 4_000
CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
FACTS = ["The office is in Lisbon, near the river", "Standup is at 9:30 every weekday",
         "Dana leads the platform team", "Deploys go out on Tuesdays", "The staging database is mercury-db"]
QUERIES = ["where is the office?", "when is standup?", "who leads the platform team?", "when do deploys go out?",
           "what is the staging database called?"]


async def victim_searches(api: str, key: str) -> list[float]:
    ms: list[float] = []
    async with httpx.AsyncClient(base_url=api, timeout=60, headers={"Authorization": f"Bearer {key}"}) as h:
        for i in range(SEARCHES):
            q = QUERIES[i % len(QUERIES)]
            t0 = time.perf_counter()
            r = await h.post("/v1/memory/search", json={"query": q, "mode": "hybrid", "limit": 3})
            ms.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
            summaries = [x["summary"] for x in r.json()["records"]]
            assert FACTS[i % len(FACTS)] in summaries, (q, summaries)  # the work was done
    return ms


async def run() -> None:
    with bench_stack("fairness", workers=("ledger", "redis-projection", "embedding")) as (stack, _):
        operator = Settings().operator_key
        _, _, victim = await new_agent(stack.api_url, operator, CONFIG)
        _, _, hostile = await new_agent(stack.api_url, operator, CONFIG)
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=60,
                                     headers={"Authorization": f"Bearer {victim}"}) as h:
            for f in FACTS:
                (await h.post("/v1/memory", json={"summary": f, "scope": "AGENT"})).raise_for_status()
        await victim_searches(stack.api_url, victim)  # warm up
        alone = await victim_searches(stack.api_url, victim)

        done, flooding = asyncio.Event(), asyncio.Event()
        answered = refused = 0

        async def flood() -> None:
            nonlocal answered, refused
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=120,
                                         headers={"Authorization": f"Bearer {hostile}"}) as h:
                while not done.is_set():
                    body = {"searches": [{"query": f"{uuid.uuid4().hex} " + "noise words " * (QUERY_CHARS // 12 - 4)}
                                         for _ in range(BATCH)]}
                    r = await h.post("/v1/memory/search/batch", json=body)
                    if r.status_code == 429:
                        refused += 1
                        # As a client should: back off for as long as the answer says.
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                        continue
                    r.raise_for_status()
                    items = r.json()["results"]
                    answered += sum("records" in x for x in items)
                    flooding.set()
                    refused += sum(x.get("status") == 429 for x in items)

        floods = [asyncio.create_task(flood()) for _ in range(HOSTILE_CONNECTIONS)]
        # The flood is under way (a batch answered) before the victim measures.
        await asyncio.wait_for(flooding.wait(), timeout=60)
        try:
            flooded = await victim_searches(stack.api_url, victim)
        finally:
            done.set()
            await asyncio.gather(*floods)
        progress(f"hostile tenant: {answered} batch items answered, {refused} refused with 429")
        for phase, xs in (("alone", alone), ("hostile", flooded)):
            figure("fairness_victim_search_ms_p95", percentile(xs, 95), "ms", len(xs), phase=phase,
                   p50=round(percentile(xs, 50), 2), hostile_items=answered if phase == "hostile" else 0,
                   hostile_refused=refused if phase == "hostile" else 0)
        figure("fairness_victim_p95_ratio", percentile(flooded, 95) / percentile(alone, 95), "x", len(flooded))
