"""ecosystem: what reaching memlane through the frameworks' ways costs.

- `mcp_search_ms_p95` beside `http_search_ms_p95`: `search_memory` over remote MCP (the official
  client's streamable HTTP transport, one session) and `POST /v1/memory/search`, SEARCHES queries
  each asked both ways, each way first half the time (the second finds the query's embedding
  cached), over an agent of RECORDS records on a private stack. Checked: both answers of a query
  hold the same records.
- `webhook_delivery_ms_p95`, `webhook_deliveries_per_s` and `webhook_lost_after_kill`
  (`webhook_figures`): one `memlane webhooks deliver` process and a local receiver.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime

import httpx
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from events import AgentConfig
from services.client import MemlaneClient
from tests.bench.common import bench_stack, figure, percentile, progress

RECORDS = 100
SEARCHES = 100
WORDS = "invoice shipping refund parcel customer account password billing order delivery address contract".split()
CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]},
                                                "tools": ["add_memory"]}})


async def run() -> None:
    with bench_stack("ecosystem", workers=("ledger", "redis-projection", "embedding")) as (stack, settings):
        tenant, agent = "bench", f"eco{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(CONFIG)
        async with MemlaneClient(stack.api_url, key) as c:
            for i in range(RECORDS):
                await c.add_memory(f"The {WORDS[i % 12]} {WORDS[(i // 12) % 12]} case {i} was settled", scope="AGENT")
        progress(f"{RECORDS} records written")
        auth = {"Authorization": f"Bearer {key}"}
        mcp_ms, http_ms = [], []
        mcp_http = create_mcp_http_client(headers=auth)
        async with mcp_http, streamable_http_client(f"{stack.api_url}/mcp", http_client=mcp_http) as (r, w, *_), \
                ClientSession(r, w) as mcp, httpx.AsyncClient(base_url=stack.api_url, headers=auth, timeout=30) as h:
            await mcp.initialize()
            for q in range(SEARCHES):
                query = f"what about the {WORDS[q % 12]} {WORDS[(q * 7) % 12]} case {q}?"

                async def over_mcp(query: str = query) -> list[str]:
                    t0 = time.perf_counter()
                    result = await mcp.call_tool("search_memory", {"query": query})
                    mcp_ms.append((time.perf_counter() - t0) * 1000)
                    assert not result.is_error, result
                    return [x["id"] for x in json.loads(result.content[0].text)["records"]]

                async def over_http(query: str = query) -> list[str]:
                    t0 = time.perf_counter()
                    got = await h.post("/v1/memory/search", json={"query": query})
                    http_ms.append((time.perf_counter() - t0) * 1000)
                    assert got.status_code == 200, got.text
                    return [x["id"] for x in got.json()["records"]]

                # Each goes first half the time: the second finds the query's embedding cached.
                if q % 2 == 0:
                    mcp_ids, http_ids = await over_mcp(), await over_http()
                else:
                    http_ids, mcp_ids = await over_http(), await over_mcp()
                assert mcp_ids and mcp_ids == http_ids, query
        figure("mcp_search_ms_p95", percentile(mcp_ms, 95), "ms", SEARCHES, agent_records=RECORDS)
        figure("http_search_ms_p95", percentile(http_ms, 95), "ms", SEARCHES, agent_records=RECORDS)
    await webhook_figures()


WRITES = 300


async def webhook_figures() -> None:
    """`webhook_delivery_ms_p95` (a record's event written to the log, to its delivery at a local
    receiver, the worker running) and `webhook_deliveries_per_s` (a backlog of WRITES drained by one `memlane webhooks
    deliver` process), then
    the worker is killed (-9) halfway through a burst of WRITES more and started again, and every
    record must have been delivered: `webhook_lost_after_kill` (must be 0) and the copies, which carry
    their first delivery's id."""
    import asyncio
    import contextlib
    import signal
    import subprocess
    import sys

    received: dict[str, list[tuple[str, float]]] = {}
    arrived = asyncio.Event()  # set at each delivery

    async def until_delivered(ids: list[str], timeout: float) -> None:
        async def every() -> None:
            while [r for r in ids if r not in received]:
                arrived.clear()
                await arrived.wait()

        await asyncio.wait_for(every(), timeout)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        if body["data"]["action"] == "added":  # a replacement also tells the replaced record's change
            # When it arrived, and how long after its event was written to the log (`created_at`).
            now = time.time()
            logged = datetime.fromisoformat(body["created_at"]).timestamp()
            received.setdefault(body["data"]["record_id"], []).append((body["id"], time.perf_counter(), now - logged))
            arrived.set()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    with bench_stack("webhooks", workers=("ledger", "redis-projection", "embedding")) as (stack, settings):
        tenant, agent = "bench", f"wh{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(CONFIG)
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30,
                                     headers={"Authorization": f"Bearer {settings.operator_key}"}) as h:
            r = await h.post("/v1/admin/webhooks", params={"tenant": tenant},
                             json={"url": url, "events": ["memory.changed"], "agent": agent})
            assert r.status_code == 201, r.text

        def start() -> subprocess.Popen:
            return subprocess.Popen([sys.executable, "-m", "services.cli", "webhooks", "deliver"], env=stack.env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        worker = start()
        sent: dict[str, float] = {}
        try:
            async with MemlaneClient(stack.api_url, key) as c:
                # Writes are capped at 200 live records an agent: each replaces the one before.
                # The first is delivered before the clock starts: the figures are of a running
                # worker, not of its start (its imports and its group join).
                last = (await c.add_memory("Ticket opened", scope="AGENT"))["memories"][-1]["id"]
                await until_delivered([last], 60)
                t0 = time.perf_counter()
                for i in range(WRITES):
                    out = await c.add_memory(f"Ticket {i} closed", scope="AGENT", replaces=last)
                    last = out["memories"][-1]["id"]
                    sent[last] = time.perf_counter()
                await until_delivered(list(sent), 120)
                secs = time.perf_counter() - t0
                lat = [received[r][0][2] * 1000 for r in sent]
                figure("webhook_delivery_ms_p95", percentile(lat, 95), "ms", WRITES, workers=1)
                figure("webhook_deliveries_per_s_paced", WRITES / secs, "deliveries/s", WRITES,
                       note="paced by the writes, each waited for")
                # Capacity: a backlog written while the worker was stopped, drained by one worker,
                # timed from its first delivery to its last.
                worker.terminate()
                worker.wait()
                backlog = []
                for i in range(WRITES):
                    last = (await c.add_memory(f"Backlog {i} closed", scope="AGENT", replaces=last))["memories"][-1]["id"]
                    backlog.append(last)
                worker = start()
                await until_delivered(backlog, 120)
                times = sorted(received[r][0][1] for r in backlog)
                figure("webhook_deliveries_per_s", (len(times) - 1) / (times[-1] - times[0]), "deliveries/s", WRITES,
                       workers=1, note="a backlog drained, first delivery to last")
                burst: list[str] = []
                for i in range(WRITES):
                    if i == WRITES // 2:
                        worker.send_signal(signal.SIGKILL)
                        worker.wait()
                        worker = start()
                    out = await c.add_memory(f"Burst {i} closed", scope="AGENT", replaces=last)
                    last = out["memories"][-1]["id"]
                    burst.append(last)
                with contextlib.suppress(TimeoutError):  # what is still missing then was lost
                    await until_delivered(burst, 120)
        finally:
            worker.kill()
            server.close()
        lost = [r for r in burst if r not in received]
        copies = sum(len(received[r]) - 1 for r in burst if r in received)
        assert all(len({d for d, *_ in received[r]}) == 1 for r in burst if r in received), "a copy had another id"
        figure("webhook_lost_after_kill", len(lost), "deliveries", WRITES, duplicates=copies)
        assert not lost, f"{len(lost)} deliveries lost after the kill"
