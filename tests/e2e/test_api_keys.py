"""API keys on the session stack when Redis loses the deployment's key store mid-run: the keys
are on `memlane.apikeys`, so every key still works and a revoked one stays refused, at once,
and the API's follower writes the store back (docs/features/api-keys.md). Only this deployment's own
key-store keys are deleted (`ml:<prefix>apikey*`): the Redis is the one every test shares."""

from __future__ import annotations

import uuid

from projections.redis.connection import scan_keys, unlink_keys
from services.auth import key_digest
from services.client import MemlaneClient
from tests.conftest import eventually, refused
from tests.redis_at import redis_at


async def test_keys_keep_working_and_revoked_ones_stay_refused_when_redis_loses_the_key_store(stack, settings):
    tenant = f"ten{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        op_key = await boot.issue_key(tenant, None, "operator")
    async with MemlaneClient(stack.api_url, op_key) as op:
        agent_key = await op.issue_key(tenant, "bot")
        helper_key = await op.issue_key(tenant, "bot", "helper")
        listed = await op.list_keys()
        helper_id = next(k["id"] for k in listed if k["role"] == "helper")
        await op.revoke_key(helper_id)

    r = redis_at(settings.redis_url)()
    try:
        store = [k async for k in scan_keys(r, f"{settings.redis_root}apikey*")]
        assert f"{settings.redis_root}apikey:{key_digest(agent_key)}" in store

        async def lost() -> bool:
            # Again if the follower's check (each second) restored the store between the two
            # calls: the checks below then run a second ahead of its next one.
            await unlink_keys(r, [k async for k in scan_keys(r, f"{settings.redis_root}apikey*")])
            return not [k async for k in scan_keys(r, f"{settings.redis_root}apikey*")]

        await eventually(lost, timeout=10)

        # At once, before anything is written back: the follower's book answers.
        async with MemlaneClient(stack.api_url, agent_key, agent="bot") as agent:
            assert (await agent.whoami())["role"] == "agent"
        async with MemlaneClient(stack.api_url, helper_key, agent="bot") as helper:
            await refused(helper.whoami(), 401, "UNAUTHENTICATED")
        async with MemlaneClient(stack.api_url, op_key) as op:
            assert sorted(k["role"] for k in await op.list_keys()) == ["agent", "operator"]

            # The follower notices the store is gone and writes it back from the log.
            async def written_back():
                return await r.get(f"{settings.redis_root}apikey:{key_digest(agent_key)}")

            await eventually(written_back, timeout=30)
            assert sorted(k["role"] for k in await op.list_keys()) == ["agent", "operator"]
            await refused(op.revoke_key(helper_id), 404, "NOT_FOUND", "key_id")
        async with MemlaneClient(stack.api_url, helper_key, agent="bot") as helper:
            await refused(helper.whoami(), 401, "UNAUTHENTICATED")
    finally:
        await r.aclose()
