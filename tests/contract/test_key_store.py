"""The key store's contract (services.auth.KeyStorePort), run against every store: the API's
(Redis, with the log of keys and its follower), Redis alone, and the unit tests' in-memory fake."""

from __future__ import annotations

import uuid

import pytest

from projections.redis.api_key_view import ApiKeyView
from services.auth import KeyStore, KeyStorePort, Principal
from settings import Settings
from tests.fakes.keys import InMemoryKeyStore
from tests.redis_at import redis_at
from workers.followers.api_keys_follower import ApiKeyLog

BOOT = "the-deployments-own-key"


@pytest.fixture(params=["logged", "redis", "fake"])
async def store(request, settings):
    if request.param == "fake":
        yield InMemoryKeyStore(BOOT)
        return
    s = Settings(topic_prefix=f"{settings.topic_prefix}keystore{uuid.uuid4().hex[:6]}.", encryption=False)
    client = redis_at(s.redis_url, s.redis_cluster)()
    log = None
    if request.param == "logged":
        log = ApiKeyLog(s, ApiKeyView(client, s.redis_root), check_every_s=0.2)
        await log.start()
    try:
        yield KeyStore(client, BOOT, s.redis_root, log=log)
    finally:
        if log is not None:
            await log.stop()
        keys = [k async for k in client.scan_iter(f"{s.redis_root}*", count=10_000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_an_issued_key_resolves_to_its_principal_and_no_other_key_does(store: KeyStorePort):
    key, entry = await store.issue("t1", "a1", "agent")
    assert await store.resolve(key) == Principal("t1", "a1", "agent", entry["id"])
    member, m = await store.issue("t1", None, "member", "dana")
    assert await store.resolve(member) == Principal("t1", None, "member", m["id"], "dana")
    for other in (None, "", key + "x", "ml_a_unknown"):
        assert await store.resolve(other) is None


async def test_the_deployments_key_is_the_deployments_operator_and_is_never_listed(store: KeyStorePort):
    assert await store.resolve(BOOT) == Principal("*", None, "operator", deployment=True)
    assert await store.list("*") == []


async def test_a_member_key_and_only_a_member_key_names_its_user(store: KeyStorePort):
    with pytest.raises(ValueError):
        await store.issue("t1", "a1", "member")
    with pytest.raises(ValueError):
        await store.issue("t1", "a1", "agent", "dana")


async def test_list_shows_a_tenants_working_keys_oldest_first_never_a_key_or_its_hash(store: KeyStorePort):
    keys = [await store.issue("t1", "a1", "agent"), await store.issue("t1", None, "member", "dana"),
            await store.issue("t2", "a1", "helper")]
    listed = await store.list("t1")
    assert [e["id"] for e in listed] == [keys[0][1]["id"], keys[1][1]["id"]]
    assert [(e["tenant"], e["agent"], e["role"], e.get("user")) for e in listed] == \
        [("t1", "a1", "agent", None), ("t1", None, "member", "dana")]
    text = repr(listed)
    assert all(k not in text for k, _ in keys) and "hash" not in text


async def test_a_revoked_key_resolves_to_nothing_and_leaves_the_list(store: KeyStorePort):
    (key, entry), (kept, _) = await store.issue("t1", "a1", "agent"), await store.issue("t1", "a1", "helper")
    assert await store.revoke("t2", entry["id"]) is None  # another tenant's id
    revoked = await store.revoke("t1", entry["id"])
    assert revoked is not None and revoked["id"] == entry["id"]
    assert await store.resolve(key) is None and await store.resolve(kept) is not None
    assert entry["id"] not in {e["id"] for e in await store.list("t1")}
    assert await store.revoke("t1", entry["id"]) is None  # once


async def test_revoking_a_member_takes_every_key_of_theirs_and_no_other(store: KeyStorePort):
    mine = [await store.issue("t1", "a1", "member", "dana"), await store.issue("t1", None, "member", "dana")]
    theirs = await store.issue("t1", "a1", "member", "eli")
    agent = await store.issue("t1", "a1", "agent")
    revoked = await store.revoke_member("t1", "dana")
    assert sorted(e["id"] for e in revoked) == sorted(e["id"] for _, e in mine)
    assert [await store.resolve(k) for k, _ in mine] == [None, None]
    assert await store.resolve(theirs[0]) is not None and await store.resolve(agent[0]) is not None
    assert await store.revoke_member("t1", "dana") == []
