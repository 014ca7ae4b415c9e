"""ecosystem: what reaching memlane through the frameworks' ways costs.

- `mcp_search_ms_p95` beside `http_search_ms_p95`: `search_memory` over remote MCP (the official
  client's streamable HTTP transport, one session) and `POST /v1/memory/search`, SEARCHES of each
  of each query in turn, each first
  half the time (the second finds the query's embedding cached), over an agent of RECORDS records on a
  private stack. Checked: both answers of a query hold the same records.
"""

from __future__ import annotations

import json
import time
import uuid

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
