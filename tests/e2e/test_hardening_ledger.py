"""Hostile writes against the real stack: one oversized write never stops the ledger or
poisons a partition, and tenants that reuse one command id never touch each other's records."""

from __future__ import annotations

import uuid

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from events import AddMemory, AgentConfig
from events.base import utcnow
from events.codec import encode
from events.limits import MAX_METADATA_BYTES
from events.topics import COMMANDS
from services.client import MemlaneClient
from tests.conftest import eventually
from workers.followers.memory_shards import shard_of

AGENT_SCOPE = {"memory": {"scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}}


async def agent_where(new_agent, want, tries: int = 60):
    """A fresh agent for which `want(tenant, agent)` holds (a commands partition, a shard)."""
    for _ in range(tries):
        made = await new_agent(AgentConfig.model_validate(AGENT_SCOPE))
        if want(made[0], made[1]):
            return made
    raise AssertionError("no agent drawn meets the condition")


def partition_of(tenant: str, agent: str) -> int:
    return COMMANDS.partition_of(f"{tenant}/{agent}".encode())


def http(stack, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}", "X-Session": "s1"},
                             timeout=60)


def assert_alive(stack) -> None:
    for name in ("ledger", "api"):
        if name in stack.procs:
            assert stack.procs[name].poll() is None, f"{name} exited with {stack.procs[name].returncode}"


async def test_a_write_whose_event_would_not_fit_never_stops_the_ledger(stack, settings, new_agent):
    ta, aa, key_a = await new_agent(AgentConfig.model_validate(AGENT_SCOPE))
    tb, ab, key_b = await agent_where(new_agent, lambda t, a: partition_of(t, a) == partition_of(ta, aa))
    async with http(stack, key_a) as a:
        r = await a.post("/v1/memory", params={"wait": "false"},
                         json={"summary": "a blob", "scope": "AGENT", "metadata": {"blob": "m" * 1_047_600}})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["field"] == "metadata" and f"limit is {MAX_METADATA_BYTES} bytes" in err["message"]
    # The same command as logged before the API refused it: it fits the broker's limit, the
    # event the ledger would make of it does not.
    cmd = AddMemory(command_id=f"blob-{uuid.uuid4().hex[:8]}", tenant=ta, agent=aa, issued_at=utcnow(), summary="a blob",
                    scope="AGENT").model_copy(update={"metadata": {"blob": "m" * 1_047_600}})
    raw = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, max_request_size=4 << 20)
    await raw.start()
    try:
        await raw.send_and_wait(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
    finally:
        await raw.stop()
    # Another tenant's write on the same partition still applies, within seconds.
    async with MemlaneClient(stack.api_url, key_b, session="s1", timeout=15) as b:
        rec = await b.add_memory("Tenant B's write goes through", scope="AGENT")
        assert rec["status"] == "applied"
        assert (await b.search_memory("goes through", mode="lexical"))[0]
    assert_alive(stack)
    async with MemlaneClient(stack.api_url, key_a, session="s1") as a:
        assert (await a.search_memory(None))[0] == []  # the blob made no record


async def test_an_oversized_write_is_refused_and_the_partition_keeps_working(stack, new_agent):
    ta, aa, key_a = await new_agent(AgentConfig.model_validate(AGENT_SCOPE))
    async with http(stack, key_a) as a:
        r = await a.post("/v1/memory", json={"summary": "too big", "scope": "AGENT",
                                             "metadata": {"blob": "m" * 1_100_000}})
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["error"]["field"] == "metadata" and "limit" in r.json()["error"]["message"]
        r = await a.post("/v1/memory", json={"summary": "nested", "scope": "AGENT", "metadata": _nested(500)})
        assert r.status_code == 422 and r.json()["error"]["field"] == "metadata", r.text
    tb, ab, key_b = await agent_where(new_agent, lambda t, a: partition_of(t, a) == partition_of(ta, aa))
    for key in (key_a, key_b):
        async with MemlaneClient(stack.api_url, key, session="s1", timeout=15) as c:
            assert (await c.add_memory("A normal write after the refusal", scope="AGENT"))["status"] == "applied"
    assert_alive(stack)


def _nested(depth: int) -> dict:
    v: dict = {}
    for _ in range(depth):
        v = {"k": v}
    return v


async def test_tenants_reusing_a_command_id_each_get_their_own_record(stack, new_agent):
    tb, ab, key_b = await new_agent(AgentConfig.model_validate(AGENT_SCOPE))
    ta, aa, key_a = await agent_where(new_agent, lambda t, a: partition_of(t, a) == partition_of(tb, ab))
    cid = f"idem-key-{uuid.uuid4().hex[:8]}"
    async with MemlaneClient(stack.api_url, key_b, session="s1") as b, \
            MemlaneClient(stack.api_url, key_a, session="s1") as a:
        made_b = await b.add_memory("Tenant B's deploy window is Tuesday", scope="AGENT", command_id=cid)
        made_a = await a.add_memory("Tenant A's deploy window is Friday", scope="AGENT", command_id=cid)
        [mem_a] = made_a["memories"]
        assert (mem_a["tenant"], mem_a["summary"]) == (ta, "Tenant A's deploy window is Friday")
        assert made_a["id"] != made_b["id"]
        assert [f.record.summary for f in (await a.search_memory("deploy window", mode="lexical"))[0]] == [
            "Tenant A's deploy window is Friday"]
        assert [f.record.summary for f in (await b.search_memory("deploy window", mode="lexical"))[0]] == [
            "Tenant B's deploy window is Tuesday"]
        # Sent again by the same agent, the command is still applied once.
        again = await a.add_memory("Tenant A's deploy window is Friday", scope="AGENT", command_id=cid)
        assert again["id"] == made_a["id"]
        assert len((await a.search_memory(None))[0]) == 1


@pytest.mark.parametrize("mode", ["lexical", "vector"])
async def test_another_tenant_deleting_its_record_of_a_reused_command_id_leaves_ours(stack, new_agent, mode):
    tb, ab, key_b = await new_agent(AgentConfig.model_validate(AGENT_SCOPE))
    shard = shard_of(tb, ab, 2)
    # The third tenant's records live in the same Qdrant shard, on another commands partition.
    tc, ac, key_c = await agent_where(
        new_agent, lambda t, a: shard_of(t, a, 2) == shard and partition_of(t, a) != partition_of(tb, ab))
    cid = f"idem-key-{uuid.uuid4().hex[:8]}"
    text = "The quarterly audit is handled by Priya from finance"
    async with MemlaneClient(stack.api_url, key_b, session="s1") as b, \
            MemlaneClient(stack.api_url, key_c, session="s1") as c:
        kept = await b.add_memory(text, scope="AGENT", command_id=cid)
        theirs = await c.add_memory(text, scope="AGENT", command_id=cid)
        assert (await c.delete_memory(theirs["id"]))["status"] == "applied"
        assert (await c.search_memory("quarterly audit Priya", mode=mode))[0] == []

        async def found():
            return [f.record.id for f in (await b.search_memory("quarterly audit Priya", mode=mode))[0]]

        assert await eventually(found, timeout=15) == [kept["id"]]
        assert (await b.read_memory(kept["id"])).status.value == "ACTIVE"
