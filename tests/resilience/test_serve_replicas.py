"""Two `memlane serve` replicas of one deployment: each folds the log into its own index, so
either answers any agent; a client that names both fails over when one dies, and the log
positions answers carry make a read on one replica see what was written through the other."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from services.client import MemlaneClient, MemlaneError
from services.stack import Stack, free_port

QUERIES = ["which language does the team use", "where is the office", "what time is standup", "who leads the team"]
FACTS = ["The team writes its services in Rust", "The office is in Lisbon, near the river",
         "Standup is at 9:30 every weekday", "Dana leads the platform team", "Lunch is usually at noon"]


@pytest.fixture(scope="module")
def replica(stack, tmp_path_factory):
    """A second serve process beside the session stack's API: same topics and Redis, its own
    data directory and port."""
    data = tmp_path_factory.mktemp("replica")
    env = {**stack.env, "MEMLANE_DATA_DIR": str(data), "MEMLANE_API_PORT": str(free_port())}
    r = Stack(env, data / "logs")
    try:
        r.start("api")
        r.wait_healthy(120)
        yield r
    finally:
        r.stop()


async def _wait_ready(url: str, timeout: float = 60) -> None:
    """Until the replica's /ready says it serves its shards caught up with the log."""
    deadline = time.monotonic() + timeout
    async with MemlaneClient(url, "-") as c:
        while (await c.http.get("/ready")).status_code != 200:
            assert time.monotonic() < deadline, f"{url} was not ready in {timeout} s"
            await asyncio.sleep(0.1)


async def test_a_read_on_one_replica_sees_a_write_through_the_other(stack, replica, new_agent):
    tenant, agent, key = await new_agent()
    await _wait_ready(replica.api_url)
    async with MemlaneClient(stack.api_url, key, session="s1") as writer, \
            MemlaneClient(replica.api_url, key, session="s1") as reader:
        pid = replica.procs["api"].pid
        os.kill(pid, signal.SIGSTOP)  # the replica falls behind while the write is indexed elsewhere
        try:
            written = await writer.add_memory("The deploy freeze starts on Friday at noon", kind="fact")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert written["status"] == "applied" and writer.positions, "a write answers with its log position"
        reader.positions = dict(writer.positions)  # what a load balancer's client carries across replicas
        found, _ = await reader.search_memory("when does the deploy freeze start")
        assert [f.record.id for f in found][:1] == [written["memories"][0]["id"]]


async def test_bad_positions_are_refused_naming_the_header(stack, new_agent):
    _, _, key = await new_agent()
    async with MemlaneClient(stack.api_url, key) as c:
        for bad in ("x:1", "99:1", "3", "1:-2"):
            r = await c.http.post("/v1/memory/search", json={"query": "q"}, headers={"X-Memlane-After": bad})
            assert r.status_code == 422 and r.json()["error"]["field"] == "x-memlane-after", (bad, r.text)


async def test_killing_a_replica_under_recall_load_loses_no_request(stack, replica, new_agent):
    _, _, key = await new_agent()
    await _wait_ready(replica.api_url)
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        for fact in FACTS:
            await c.add_memory(fact, kind="fact")
    urls = [replica.api_url, stack.api_url]  # every client starts on the replica that dies

    async def searches(client: MemlaneClient) -> dict[str, list[str]]:
        return {q: [f.record.id for f in (await client.search_memory(q, limit=3))[0]] for q in QUERIES}

    async with MemlaneClient(urls, key, session="s1") as c:
        before = await searches(c)
        assert all(before.values()), before
    answered, failed, killed_at = [], [], []

    async def load(i: int) -> None:
        async with MemlaneClient(urls, key, session="s1", failover_s=15) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    # A new conversation each time: one recalls a record once (memory.recall.recalled).
                    out = await client.recall(f"c{i}-{len(answered)}", QUERIES[i % len(QUERIES)])
                    answered.append((time.monotonic(), client.at, bool(out["workspaceEntries"]) and "<memory" in out["rendered"]))
                except (MemlaneError, httpx.HTTPError) as err:  # counted: the test fails on any
                    failed.append(repr(err))
                if killed_at and len([a for a in answered if a[0] > killed_at[0]]) >= 40:
                    return

    async def kill_midway() -> None:
        deadline = time.monotonic() + 60
        while len(answered) < 30:
            assert time.monotonic() < deadline and not failed, (len(answered), failed[:3])
            await asyncio.sleep(0.01)
        killed_at.append(time.monotonic())
        replica.kill("api")  # SIGKILL

    await asyncio.gather(*(load(i) for i in range(4)), kill_midway())
    assert not failed, failed[:3]
    after_kill = [a for a in answered if a[0] > killed_at[0]]
    assert len(after_kill) >= 40 and all(at == 1 for _, at, _ in after_kill[-8:]), "the survivor answered"
    empty = [(round(t - killed_at[0], 2), at) for t, at, ok in answered if not ok]
    assert not empty, f"every recall carried its memory block; empty ones (s after the kill, replica): {empty}"
    async with MemlaneClient(urls, key, session="s1") as c:
        assert await searches(c) == before
