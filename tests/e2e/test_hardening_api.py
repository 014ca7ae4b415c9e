"""The HTTP, MCP and CLI surface under hostile or unlucky use: keys stay in their deployment
and can be listed and revoked; bad input gets a 4xx naming the field; /health tells the
truth; `wait=true` never claims what the record view does not show; the MCP server offers
a helper no write tools and answers every request."""

from __future__ import annotations

import asyncio
import base64
import json
import select
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from services.client import MemlaneClient
from services.stack import free_port
from tests.conftest import eventually, refused


async def test_a_key_of_one_deployment_is_refused_by_another(model_stack, jobs_stack, settings):
    # Two deployments on the same Redis and broker (other topic prefixes, their own APIs) that
    # the e2e tier starts anyway; stacks of this module's own would cost two more starts. Only
    # their keys are used here, never their workers.
    (stack, _), (other, _) = model_stack, jobs_stack
    tenant = f"ten{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        agent_key = await boot.issue_key(tenant, "bot")
        operator_key = await boot.issue_key(tenant, None, "operator")
    for key in (agent_key, operator_key):
        async with MemlaneClient(stack.api_url, key, agent="bot") as here, MemlaneClient(
            other.api_url, key, agent="bot"
        ) as there:
            await here.config()  # accepted where it was issued
            await refused(there.config(), 401, "UNAUTHENTICATED", "authorization")
    async with MemlaneClient(other.api_url, settings.operator_key) as boot:
        theirs = await boot.issue_key(tenant, "bot")
    async with MemlaneClient(stack.api_url, theirs) as here:
        await refused(here.config(), 401, "UNAUTHENTICATED")


async def test_keys_are_listed_without_secrets_and_revoked_at_once(stack, settings):
    tenant, stranger = f"ten{uuid.uuid4().hex[:6]}", f"ten{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        op_key = await boot.issue_key(tenant, None, "operator")
        await boot.issue_key(stranger, "bot")
        await refused(boot.list_keys(), 422, "VALIDATION_FAILED", "tenant")
    async with MemlaneClient(stack.api_url, op_key) as op:
        agent_key = await op.issue_key(tenant, "bot")
        helper_key = await op.issue_key(tenant, "bot", "helper")
        listed = await op.list_keys()
        assert sorted((k["role"], k["agent"]) for k in listed) == [("agent", "bot"), ("helper", "bot"),
                                                                  ("operator", None)]
        assert all(set(k) == {"id", "tenant", "agent", "role", "created"} and k["tenant"] == tenant for k in listed)
        raw = (await op.http.get("/v1/admin/keys")).text
        assert not any(secret in raw for secret in (op_key, agent_key, helper_key))
        await refused(op.list_keys(stranger), 403, "FORBIDDEN", "tenant")
        async with MemlaneClient(stack.api_url, agent_key, agent="bot") as agent:
            assert (await agent.whoami())["role"] == "agent"
            await refused(agent.list_keys(tenant), 403, "FORBIDDEN")
            victim = next(k["id"] for k in listed if k["role"] == "agent")
            revoked = await op.revoke_key(victim)
            assert revoked["id"] == victim and "key" not in revoked
            await refused(agent.whoami(), 401, "UNAUTHENTICATED")
        assert victim not in [k["id"] for k in await op.list_keys()]
        await refused(op.revoke_key(victim), 404, "NOT_FOUND", "key_id")
        async with MemlaneClient(stack.api_url, helper_key) as helper:
            assert (await helper.whoami())["role"] == "helper"


@pytest.mark.parametrize("body, field", [
    ({"tenant": "acme corp", "agent": "bot"}, "tenant"),
    ({"tenant": "a/b", "agent": "bot"}, "tenant"),
    ({"tenant": "", "agent": "bot"}, "tenant"),
    ({"tenant": "acme", "agent": "bot\nx"}, "agent"),
    ({"tenant": "acme", "agent": "*"}, "agent"),
    ({"tenant": "t" * 129, "agent": "bot"}, "tenant"),
    ({"tenant": "acme", "agent": None, "role": "agent"}, "agent"),
])
def test_key_requests_with_bad_names_are_refused(stack, settings, body, field):
    r = httpx.post(f"{stack.api_url}/v1/admin/keys", json=body,
                   headers={"Authorization": f"Bearer {settings.operator_key}"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


def _raw(stack, method: str, path: str, body: str | bytes | None = None, **headers: str) -> httpx.Response:
    h = [(k.replace("_", "-").encode(), v.encode("latin-1")) for k, v in headers.items()]
    if body is not None:
        h.append((b"content-type", b"application/json"))
    return httpx.request(method, f"{stack.api_url}{path}", content=body, headers=h, timeout=60)


async def test_hostile_input_gets_a_4xx_naming_the_field(stack, new_agent, settings):
    _, _, key = await new_agent()
    auth = {"Authorization": f"Bearer {key}", "X_Session": "s1"}
    nan = base64.urlsafe_b64encode(b'[NaN, "x"]').decode().rstrip("=")
    cases = [
        ("GET", f"/v1/memory?after={nan}", None, auth, 422, "after"),
        ("POST", "/v1/memory/search", json.dumps({"after": nan}), auth, 422, "after"),
        ("POST", "/v1/memory/search", '{"query": "x", "mode": "lexical", "labels": {"a": "\\ud800"}}', auth, 422,
         "labels.a"),
        ("POST", "/v1/memory/search", '{"query": "x", "mode": "lexical", "labels": {"\\udfff": "a"}}', auth, 422,
         "labels"),
        ("POST", "/v1/memory/search", '{"query": "x", "mode": "lexical", "kind": "x\\ud800"}', auth, 422, "kind"),
        ("POST", "/v1/memory", '{"summary": "s", "metadata": {"k": ["\\udc80"]}}', auth, 422, "metadata.k.0"),
        ("POST", "/v1/admin/keys", '{"tenant": "\\ud800", "agent": "a"}',
         {"Authorization": f"Bearer {settings.operator_key}"}, 422, "tenant"),
        ("GET", "/v1/config", None, {"Authorization": "Bearer \u00e9\u00ff"}, 401, "authorization"),
        ("POST", "/v1/memory", json.dumps({"summary": "s", "metadata": _nested(500)}), auth, 422, "metadata"),
        ("POST", "/v1/memory", json.dumps({"summary": "s", "metadata": {"blob": "m" * 2_200_000}}), auth, 413, "body"),
        # A surrogate as raw bytes (ED A0 80), which the JSON parser reads back as a lone one.
        ("POST", "/v1/memory/search", b'{"query": "q", "kind": "k\xed\xa0\x80"}', auth, 422, "kind"),
        ("POST", "/v1/memory/search", b'{"query": "q", "labels": {"a\xed\xb0\x80": "v"}}', auth, 422, "labels"),
        ("POST", "/v1/memory/search/batch", b'{"searches": [{"query": "q", "kind": "\xed\xa0\x80"}]}', auth, 422,
         "searches.0.kind"),
        ("POST", "/v1/memory", b'{"summary": "caf\xe9"}', auth, 422, "body"),  # Latin-1, not UTF-8
    ]
    for method, path, body, headers, status, field in cases:
        r = _raw(stack, method, path, body, **headers)
        assert (r.status_code, r.json()["error"]["field"]) == (status, field), (path, body and body[:80], r.text[:300])
        assert r.headers["content-type"] == "application/json"
    deep = _raw(stack, "POST", "/v1/memory", json.dumps({"summary": "s", "metadata": _nested(500)}), **auth)
    assert "nested deeper than" in deep.json()["error"]["message"]


def _nested(depth: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(depth):
        node = {"n": node}
    return node


async def test_a_burst_of_requests_waits_for_connections_instead_of_failing(stack, new_agent):
    # More concurrent requests than the API's Redis connection pool holds.
    _, _, key = await new_agent()
    limits = httpx.Limits(max_connections=400)
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=60,
                                 limits=limits) as http:
        answers = await asyncio.gather(*(http.post("/v1/memory/search", json={"query": f"burst {i}", "mode": "lexical"},
                                                   headers={"X-Session": "s1"}) for i in range(400)))
    assert [r.status_code for r in answers if r.status_code != 200] == []


async def test_health_degrades_while_the_ledger_is_dead(stack):
    async def health() -> httpx.Response:
        async with httpx.AsyncClient() as c:
            return await c.get(f"{stack.api_url}/health", timeout=10)

    ok = await health()
    assert ok.status_code == 200 and ok.json()["workers"]["ledger"]["alive"], ok.text
    stack.kill("ledger")  # SIGKILL: no goodbye, only a heartbeat that stops
    try:
        async def degraded():
            r = await health()
            return r if r.status_code == 503 else None

        r = await eventually(degraded, timeout=30)
        assert r.json()["status"] == "degraded" and not r.json()["workers"]["ledger"]["alive"]
        assert any("worker ledger" in p for p in r.json()["problems"]), r.text
    finally:
        stack.start("ledger")

    async def recovered():
        r = await health()
        return r if r.status_code == 200 else None

    assert (await eventually(recovered, timeout=60)).json()["status"] == "ok"


async def test_wait_true_answers_504_when_the_record_view_is_stopped(stack, new_agent):
    _, _, key = await new_agent()
    projection = stack.procs["redis-projection"]
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        await c.add_memory("Warm-up: the ledger and both projections have seen this agent")
        command_id = str(uuid.uuid4())
        projection.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            e = await refused(c.add_memory("The invoice cutoff is the 25th", command_id=command_id), 504, "TIMEOUT")
            waited = time.monotonic() - t0
            assert "redis-projection" in e.message and "record" in e.message
            assert command_id in e.message, "the 504 names the command to look for or send again"
            # The record view's wait is bounded (6 s) on top of the ledger and the index.
            assert waited < 15, waited
        finally:
            projection.send_signal(signal.SIGCONT)

        async def listed():
            return [r for r in (await c.list_memory())["records"] if r["summary"] == "The invoice cutoff is the 25th"]

        assert len(await eventually(listed, timeout=30)) == 1

        # A request waiting for the stopped worker is answered once the worker resumes and
        # applies the version, well before its timeout.
        async def points() -> int:
            async with httpx.AsyncClient() as h:
                return (await h.get(f"{stack.api_url}/health", timeout=10)).json()["projection"]["points"]

        before = await points()
        projection.send_signal(signal.SIGSTOP)
        try:
            waiting = asyncio.ensure_future(c.add_memory("The late fee is 2 percent"))

            async def indexed() -> bool:  # from then on the request waits for the record view alone
                return await points() > before

            await eventually(indexed, timeout=30)
            assert not waiting.done()
        finally:
            projection.send_signal(signal.SIGCONT)
        t0 = time.monotonic()
        added = await asyncio.wait_for(waiting, 30)
        assert time.monotonic() - t0 < 3, "the record view's announcement answers the waiting request"
        assert (await c.read_memory(added["id"])).summary == "The late fee is 2 percent"

        # With the worker running, `wait=true` answers as soon as the view has the version,
        # and a read right after shows it.
        for i in range(3):
            t0 = time.monotonic()
            added = await c.add_memory(f"The renewal notice goes out {i + 2} weeks ahead")
            assert time.monotonic() - t0 < 3, "wait=true waits for the view's announcement, not for a timeout"
            assert (await c.read_memory(added["id"])).version == added["memories"][0]["version"]


async def test_a_configuration_is_answered_once_the_record_view_serves_it(stack, new_agent, settings):
    """Every read takes the agent's configuration from the record view: a PUT that answered
    before the view had it let the next call see the old one (history refused as off)."""
    from aiokafka import TopicPartition

    from events.codec import decode
    from events.config import AgentConfig, HistoryConfig
    from events.topics import EVENTS
    from workers.runtime.topic_reader import TopicReader

    tenant, agent, key = await new_agent()
    projection = stack.procs["redis-projection"]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        projection.send_signal(signal.SIGSTOP)
        try:
            waiting = asyncio.ensure_future(op.configure(AgentConfig(history=HistoryConfig())))

            async def logged() -> bool:  # the ledger applied it: the API's own index has it at once
                async with TopicReader(settings) as c:
                    tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
                    return any(e.type == "AgentConfigured" and e.agent == agent and e.config.history is not None
                               for e in (decode(EVENTS.name, m.value) for m in await c.read_all(tps)
                                         if agent.encode() in m.value))

            await eventually(logged, timeout=30)
            with pytest.raises(TimeoutError):  # the answer waits for the record view
                await asyncio.wait_for(asyncio.shield(waiting), 2)
        finally:
            projection.send_signal(signal.SIGCONT)
        await asyncio.wait_for(waiting, 30)
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        assert (await c.search_history(query="anything"))["events"] == []  # history is on: no 403


def _mcp(stack, key: str | None, *args: str, **env: str) -> subprocess.Popen:
    e = {**stack.env, "MEMLANE_API_URL": stack.api_url, "MEMLANE_SESSION": "s1", **env}
    e.pop("MEMLANE_API_KEY", None)
    if key is not None:
        e["MEMLANE_API_KEY"] = key
    return subprocess.Popen([sys.executable, "-m", "services.cli", "mcp", *args], env=e, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _rpc(p: subprocess.Popen, line: str, reply: bool = True, timeout: float = 30) -> dict | None:
    p.stdin.write(line.encode() + b"\n")
    p.stdin.flush()
    if not reply:
        return None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return json.loads(p.stdout.readline()) if ready else None


async def test_mcp_offers_a_helper_no_write_tools_and_answers_bad_requests(stack, new_agent, settings, tmp_path):
    tools = {"memory": {"tools": ["add_memory", "read_memory", "delete_memory", "pin_memory", "curate_block"]}}
    tenant, agent, _ = await new_agent(tools)
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        helper = await boot.issue_key(tenant, agent, "helper")
    key_file = tmp_path / "key"
    key_file.write_text(helper + "\n")
    p = _mcp(stack, None, "--key-file", str(key_file))
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        assert "result" in _rpc(p, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}))
        _rpc(p, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), reply=False)
        listed = _rpc(p, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        assert sorted(t["name"] for t in listed["result"]["tools"]) == ["read_memory", "search_memory"]
        bad = '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search_memory", ' \
              '"arguments": {"query": "\\ud800"}}}'
        reply = _rpc(p, bad)
        assert reply is not None, "no reply to a request holding a lone surrogate"
        assert reply["id"] == 3 and "lone surrogate" in reply["error"]["message"]
        deep = '{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": ' + "[" * 5000 + "]" * 5000 + "}"
        reply = _rpc(p, deep)
        assert reply is not None and "nested too deep" in reply["error"]["message"], reply
        fine = _rpc(p, json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                   "params": {"name": "search_memory", "arguments": {"query": "ok"}}}))
        assert fine["id"] == 4 and fine["result"]["isError"] is False
    finally:
        p.kill()
        p.wait()


def test_the_cli_refuses_keys_in_argv_unknown_keys_and_the_default_operator_key(stack):
    argv = _mcp(stack, None, "--key", "ml_a_secret")
    out, err = argv.communicate(timeout=60)
    assert argv.returncode == 2 and "MEMLANE_API_KEY" in err.decode() and "Traceback" not in err.decode()
    unknown = _mcp(stack, "ml_a_nobody")
    out, err = unknown.communicate(timeout=60)
    lines = err.decode().strip().splitlines()
    assert unknown.returncode == 1 and len(lines) == 1 and "unknown or revoked" in lines[0], err.decode()
    for args in (["serve", "--port", str(free_port())], ["worker", "ledger"]):
        env = {**stack.env, "MEMLANE_DEV": "0"}
        proc = subprocess.run([sys.executable, "-m", "services.cli", *args], env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and "default development key" in proc.stderr, proc.stderr[-500:]


def test_dev_mode_warns_about_the_default_operator_key(stack):
    assert '"default_operator_key"' in (stack.log_dir / "api.log").read_text()


async def test_answers_that_can_hold_memory_are_never_cached(stack, new_agent):
    _, _, key = await new_agent()
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}) as h:
        for r in (await h.get("/v1/memory"), await h.post("/v1/memory/search", json={"query": "q"}),
                  await h.get("/v1/memory/nope")):
            assert r.headers["cache-control"] == "no-store", (r.request.url, r.headers)
        assert (await h.get("/ui/static/app.js")).headers["cache-control"] == "max-age=300"  # its own
