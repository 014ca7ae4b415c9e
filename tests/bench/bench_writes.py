"""`make bench ONLY=writes`: acknowledged writes under concurrency, `wait=true`.

`write_ms_p95_8_clients` (and p50): 8 clients, each adding facts to its own agent and lines to
one block the 8 share, for 30 s; every answer must be `applied` (a 504 counts in `timeouts`,
which must be 0), and the listing must hold every acknowledged fact before a figure prints.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from events import AgentConfig
from services.client import MemlaneClient, MemlaneError
from settings import Settings
from tests.bench.common import bench_stack, figure, median, percentile, progress

CLIENTS, SECONDS = 8, 30.0
CONFIG = AgentConfig.model_validate({"memory": {"tools": ["add_memory", "curate_block"]}})


async def new_agent(api_url: str, operator_key: str, config: AgentConfig) -> tuple[str, str, str]:
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(api_url, operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        await op.configure(config)  # answered once the view holds it
    return tenant, agent, key


async def run() -> None:
    with bench_stack("writes") as (stack, _):
        operator = Settings().operator_key
        agents = [await new_agent(stack.api_url, operator, CONFIG) for _ in range(CLIENTS)]
        shared_key = agents[0][2]
        latencies: list[float] = []
        timeouts = 0
        acked: dict[str, int] = {}
        end = time.monotonic() + SECONDS

        async def client(i: int) -> None:
            nonlocal timeouts
            _, agent, key = agents[i]
            async with MemlaneClient(stack.api_url, key, session="s1") as own, \
                    MemlaneClient(stack.api_url, shared_key, session="s1") as shared:
                n = 0
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    try:
                        if n % 4 == 1:  # the block all clients share, a line added then removed: the race that answered 504
                            await shared.curate_block("notes", "add", line=f"client {i} line {n}")
                        elif n % 4 == 3:
                            await shared.curate_block("notes", "remove", old=f"client {i} line {n - 2}")
                        else:
                            out = await own.add_memory(f"Client {i} fact number {n} about item {n * 7 + i}")
                            assert out["status"] == "applied", out
                            acked[agent] = acked.get(agent, 0) + 1
                    except MemlaneError as e:
                        if e.status != 504:
                            raise
                        timeouts += 1
                    latencies.append((time.perf_counter() - t0) * 1000)
                    n += 1

        progress(f"{CLIENTS} clients writing for {SECONDS:.0f} s")
        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        for _, agent, key in agents:  # the work was done: every acknowledged fact is listed
            listed, cursor = 0, None
            async with MemlaneClient(stack.api_url, key, session="s1") as c:
                while True:
                    page = await c.list_memory(first=100, after=cursor)
                    listed += len(page["records"])
                    if not (cursor := page.get("next_cursor")):
                        break
            assert listed >= acked.get(agent, 0), (agent, listed, acked.get(agent))
        figure("write_ms_p95_8_clients", percentile(latencies, 95), "ms", len(latencies), clients=CLIENTS,
               seconds=SECONDS, p50=round(median(latencies), 3), timeouts=timeouts, facts=sum(acked.values()))
