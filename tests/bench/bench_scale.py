"""scale: recall throughput with one and two `memlane serve` replicas, a replica's
failover, and the scale figures of the history and Kafka benches.

One deployment (ledger, embedding and redis-projection workers, serve replica A) holds
`RECORDS` records of one agent; replica B (its own data directory and port) folds the same
log. `CLIENTS` concurrent recall loops run for `SECONDS` against A alone, then spread over A
and B; then B is killed (SIGKILL) under the same load and `serve_failover_s` is the longest
time, over the loops that were on B, from the kill to their next answer. Every recall must
carry records (checked before a figure is printed). The load generator shares the machine's
cores with what it measures.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

from services.client import MemlaneClient
from services.stack import Stack, free_port
from settings import Settings
from tests.bench.common import bench_stack, figure, progress

RECORDS = 200  # the default cap of live facts per agent
CLIENTS = 8
SECONDS = 10.0  # per round; the medians of ROUNDS alternated rounds are the figures
ROUNDS = 3
WARMUP_S = 5.0
WORDS = ("invoice shipping refund parcel customer account password billing order delivery address contract "
         "warehouse courier discount voucher").split()
QUERIES = [f"what about the {a} and the {b}?" for a in WORDS[:8] for b in WORDS[8:]]


def fact(i: int) -> str:
    return f"Customer {i} asked about the {WORDS[i % len(WORDS)]} for their {WORDS[(i * 7) % len(WORDS)]} (case {i})"


async def _populate(url: str, settings: Settings) -> str:
    async with MemlaneClient(url, settings.operator_key, tenant="scale", agent="bot") as op:
        key = await op.issue_key("scale", "bot")
    sem = asyncio.Semaphore(8)

    async def add(i: int) -> None:
        async with sem, MemlaneClient(url, key, session="s1") as c:
            await c.add_memory(fact(i), kind="fact")

    await asyncio.gather(*(add(i) for i in range(RECORDS)))
    return key


async def _ready(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    async with MemlaneClient(url, "-") as c:
        while (await c.http.get("/ready")).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} was not ready in {timeout} s")
            await asyncio.sleep(0.2)


async def _load(urls_of, key: str, seconds: float, on_kill=None) -> dict:
    """`CLIENTS` recall loops for `seconds`; loop i calls `urls_of(i)` (its replicas, first one
    first). `on_kill`: a coroutine started halfway that kills a replica and returns when."""
    answered, empty, failed = [], 0, []
    killed: list[float] = []
    stop = time.monotonic() + seconds
    run = uuid.uuid4().hex[:8]  # conversations of their own: one recalls a record once

    async def loop(i: int) -> None:
        nonlocal empty
        async with MemlaneClient(urls_of(i), key, session="s1", failover_s=15) as c:
            first = c.urls[0]
            n = 0
            while time.monotonic() < stop:
                n += 1
                try:
                    out = await c.recall(f"{run}-{i}-{n}", QUERIES[(i * 31 + n) % len(QUERIES)])
                except Exception as err:
                    failed.append(repr(err))
                    continue
                answered.append((i, first, time.monotonic()))
                empty += not out["workspaceEntries"]

    async def kill_halfway() -> None:
        await asyncio.sleep(seconds / 2)
        killed.append(await on_kill())

    await asyncio.gather(*(loop(i) for i in range(CLIENTS)), *([kill_halfway()] if on_kill else []))
    if failed or empty:
        raise RuntimeError(f"{len(failed)} recalls failed ({failed[:2]}), {empty} came back without records")
    return {"answered": answered, "killed": killed[0] if killed else None}


async def run() -> None:
    with bench_stack("scale", workers=("ledger", "embedding", "redis-projection")) as (stack, settings):
        progress(f"writing {RECORDS} records through replica A")
        key = await _populate(stack.api_url, settings)
        data = settings.data_dir / "replica-b"
        b = Stack({**stack.env, "MEMLANE_DATA_DIR": str(data), "MEMLANE_API_PORT": str(free_port())}, data / "logs")
        b.start("api")
        try:
            b.wait_healthy(300)
            await _ready(b.api_url)
            a_url, b_url = stack.api_url, b.api_url
            async with MemlaneClient(b_url, key, session="s1") as c:  # B holds what A indexed, read through B alone
                found, _ = await c.search_memory(QUERIES[0], limit=5)
            assert found, "replica B serves the agent's records"

            one_url, two_urls = (lambda i: [a_url]), (lambda i: [a_url, b_url] if i % 2 == 0 else [b_url, a_url])
            await _load(two_urls, key, WARMUP_S)  # both replicas fault their shards in
            rates: dict[int, list[float]] = {1: [], 2: []}
            counts = {1: 0, 2: 0}  # recalls answered, each with records
            for r in range(ROUNDS):  # alternated, so drift on a shared machine hits both alike
                for replicas, urls_of in ((1, one_url), (2, two_urls)):
                    out = await _load(urls_of, key, SECONDS)
                    rates[replicas].append(len(out["answered"]) / SECONDS)
                    counts[replicas] += len(out["answered"])
                    progress(f"round {r + 1}/{ROUNDS}: {replicas} replica(s) {rates[replicas][-1]:.1f} recalls/s")
            r1, r2 = statistics.median(rates[1]), statistics.median(rates[2])
            assert r1 > 0 and r2 > 0
            figure("recall_per_s_concurrent", r1, "recalls/s", counts[1], replicas=1, clients=CLIENTS,
                   records=RECORDS, rounds=ROUNDS, seconds=SECONDS)
            figure("recall_per_s_concurrent", r2, "recalls/s", counts[2], replicas=2, clients=CLIENTS,
                   records=RECORDS, rounds=ROUNDS, seconds=SECONDS)
            figure("recall_per_s_ratio_2_over_1", r2 / r1, "ratio", counts[1] + counts[2], clients=CLIENTS, rounds=ROUNDS)

            async def kill_b() -> float:
                b.kill("api")
                return time.monotonic()

            progress("killing replica B (SIGKILL) halfway through the same load")
            out = await _load(two_urls, key, SECONDS, kill_b)
            t_kill = out["killed"]
            on_b = {i for i, first, _ in out["answered"] if first == b_url}
            after = {}
            for i, _, t in out["answered"]:
                if i in on_b and t > t_kill and i not in after:
                    after[i] = t - t_kill
            assert on_b and set(after) == on_b, "every loop that was on B was answered again"
            figure("serve_failover_s", max(after.values()), "s", len(out["answered"]), replicas=2, clients=CLIENTS,
                   loops_failed_over=len(on_b))
        finally:
            b.stop()
    from tests.bench import bench_scale_history, bench_scale_kafka

    await bench_scale_history.run()
    await bench_scale_kafka.run()
