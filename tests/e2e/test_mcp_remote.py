"""Remote MCP (`/mcp` on the API) as an agent framework uses it: the official MCP client's
streamable HTTP transport, the key as a bearer token. The same tools and refusals as over stdio;
bad requests get JSON-RPC errors."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import httpx
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from services.client import MemlaneClient
from tests.e2e.test_profiles import members

TOOLS = {"memory": {"tools": ["add_memory", "read_memory", "delete_memory"]}}


@asynccontextmanager
async def mcp_session(stack, key: str, **headers: str):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}", **headers})
    async with http, streamable_http_client(f"{stack.api_url}/mcp", http_client=http) as (read, write, *_), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def answer(result) -> dict:
    assert result.is_error is False, result
    return json.loads(result.content[0].text)


async def test_the_tools_over_http_are_the_keys_own(stack, settings, new_agent):
    tenant, agent, key = await new_agent(TOOLS)
    async with mcp_session(stack, key, **{"X-Session": "s1"}) as mcp:
        assert sorted(t.name for t in (await mcp.list_tools()).tools) == [
            "add_memory", "delete_memory", "read_memory", "search_memory"]
        written = answer(await mcp.call_tool("add_memory", {"summary": "The on-call rota changes every Monday"}))
        [stored] = written["memories"]
        found = answer(await mcp.call_tool("search_memory", {"query": "when does the on-call rota change?"}))
        assert found["records"][0]["id"] == stored["id"]
        # A refusal is the tool's error, as over stdio: a summary over its limit names the field.
        refused = await mcp.call_tool("add_memory", {"summary": "x" * 100_000})
        assert refused.is_error and "summary" in refused.content[0].text
    # The write is the agent's own, made in the session the request named.
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        read = await c.read_memory(stored["id"])
        assert (read.summary, read.session) == ("The on-call rota changes every Monday", "s1")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        helper = await op.issue_key(tenant, agent, "helper")
    async with mcp_session(stack, helper) as mcp:  # a helper never writes: no write tools
        assert sorted(t.name for t in (await mcp.list_tools()).tools) == ["read_memory", "search_memory"]


async def test_keys_that_get_no_tools_and_bad_requests_get_json_rpc_errors(stack, settings, new_agent):
    tenant, agent, key = await new_agent(TOOLS)
    member = (await members(stack, settings, tenant, agent, "dana"))["dana"]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        for headers, status, says in (({}, 401, "bearer"), ({"Authorization": "Bearer not-a-key"}, 401, ""),
                                      ({"Authorization": f"Bearer {member}"}, 403, "agent's key")):
            r = await http.post("/mcp", json=init, headers={**accept, **headers})
            assert r.status_code == status, r.text
            assert r.json()["jsonrpc"] == "2.0" and says in r.json()["error"]["message"].lower()
        auth = {**accept, "Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for body in (b"{not json", b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": "\xff"}'):
            r = await http.post("/mcp", content=body, headers=auth)
            assert 400 <= r.status_code < 500 and r.json()["error"]["code"] == -32700, r.text
        r = await http.post("/mcp", json=init, headers={**auth, "X-Invocation": "three"})
        assert r.status_code == 422 and "x-invocation" in r.json()["error"]["message"]


async def test_a_client_that_stalls_mid_request_holds_up_no_other(stack, new_agent):
    _, _, key = await new_agent(TOOLS)
    host, port = stack.api_url.removeprefix("http://").split(":")
    # A client that sends half its request and then stops, holding its connection open.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                 "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                 "Content-Length: 4096\r\n\r\n{\"jsonrpc\": \"2.0\", ".encode())
    await writer.drain()
    try:
        async with asyncio.timeout(10), mcp_session(stack, key, **{"X-Session": "s1"}) as mcp:
            written = answer(await mcp.call_tool("add_memory", {"summary": "Deploys freeze on Fridays"}))
            assert written["memories"][0]["id"]
        assert not reader.at_eof()  # the stalled request is still open: it was waited on, not dropped
    finally:
        writer.close()
