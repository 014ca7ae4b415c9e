"""Redis wiped mid-run (FLUSHALL on the deployment's own Redis) while every process runs: the log
is the truth, so every key still works and every revoked key stays refused, a signed-in web
session still holds, and every projection comes back from the log: the records and their
listing, the agent's configuration, and the session's history."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from events import AgentConfig
from services.client import MemlaneClient, MemlaneError, TurnPublisher
from tests.conftest import eventually
from tests.e2e.test_history import conversation

CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}},
                                     "history": {"index": "messages"}})
FACTS = ["The office is in Lisbon", "Standup is at 9:30", "Deploys go out on Tuesdays"]


# On the bare deployment (tests/stacks.py), whose Redis is its own: the test wipes it.
async def test_after_a_flushall_keys_hold_and_every_projection_comes_back_from_the_log(bare_stack):
    stack, own = bare_stack.stack, bare_stack.settings
    stack.start_all(("ledger", "redis-projection", "history", "embedding"))
    tenant, agent = "wiped", "bot"
    async with MemlaneClient(stack.api_url, own.operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        revoked = await op.issue_key_entry(tenant, agent)
        await op.revoke_key(revoked["id"], tenant)
        await op.configure(CONFIG)
    async with TurnPublisher(own.kafka_bootstrap, own.topic_prefix) as pub:
        for t in conversation(tenant, agent):
            await pub.publish(t)
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        for f in FACTS:
            await c.add_memory(f, scope="AGENT")

        async def seen():
            try:
                listed = sorted(r["summary"] for r in (await c.list_memory(first=50))["records"])
                said = [m["id"] for m in (await c.message_history())["events"]]
            except MemlaneError as e:  # the configuration not folded back yet: history off
                assert e.code == "HISTORY_DISABLED", e
                return None
            return (listed, said) if listed == sorted(FACTS) and said else None

        before = await eventually(seen, timeout=60)
        r = aioredis.from_url(own.redis_url)
        try:
            await r.flushall()
            assert await r.dbsize() < 5  # gone (a heartbeat may already be back)
        finally:
            await r.aclose()

        assert await eventually(seen, timeout=60) == before
    for gone in (revoked["key"], "ml_not_a_key"):
        async with MemlaneClient(stack.api_url, gone, session="s1") as c:
            try:
                await c.list_memory()
            except MemlaneError as e:
                assert e.status == 401, e
            else:
                raise AssertionError("a revoked key read memory after Redis was wiped")
    assert httpx.get(f"{stack.api_url}/health", timeout=10).json()["projection"]["caught_up"]
