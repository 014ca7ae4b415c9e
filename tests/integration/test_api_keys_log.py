"""API keys and web sessions outlive Redis losing its data: keys and revocations go to
`memlane.apikeys` on the real broker first, sign-ins and sign-outs to `memlane.websessions`, and
the API process's followers rebuild the Redis view from them (docs/features/api-keys.md). Each test has a redis-server of its own (tests/private_redis.py), so its
FLUSHALL reaches no other test's data."""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager

import pytest
from aiokafka import TopicPartition

from events.topics import API_KEYS
from events.web_sessions import session_hash
from projections.redis.api_key_view import ApiKeyView
from services.auth import KeyStore, key_digest
from services.http.sessions import SESSION_TTL_S, WebSessions
from settings import Settings
from tests.conftest import eventually
from tests.private_redis import PrivateRedis
from tests.redis_at import redis_at
from workers.followers.api_keys_follower import ApiKeyLog
from workers.followers.web_sessions_follower import WebSessionLog
from workers.runtime.topic_reader import TopicReader

BOOT = "the-deployments-own-key"


@pytest.fixture
async def redis(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        await eventually(server.ping, timeout=10)
        client = redis_at(server.url, False)()
        yield client
        await client.aclose()
    finally:
        server.stop()


@pytest.fixture
def deployment(settings) -> Settings:
    return Settings(topic_prefix=f"{settings.topic_prefix}apikeys{uuid.uuid4().hex[:6]}.", encryption=False)


@asynccontextmanager
async def api_process(s: Settings, client):
    """What an API process holds of its keys: the store and its follower, started from the topic."""
    log = ApiKeyLog(s, ApiKeyView(client, s.redis_root), check_every_s=0.2)
    await log.start()
    try:
        yield KeyStore(client, BOOT, s.redis_root, log=log)
    finally:
        await log.stop()


def redis_alone(s: Settings, client) -> KeyStore:
    """A store that reads Redis only: what the view itself holds."""
    return KeyStore(client, BOOT, s.redis_root)


async def issue_four(store: KeyStore) -> dict[str, tuple[str, dict]]:
    keys = {"agent": await store.issue("acme", "bot", "agent"), "operator": await store.issue("acme", None, "operator"),
            "helper": await store.issue("acme", "bot", "helper"), "member": await store.issue("acme", None, "member", "dana")}
    assert (await store.revoke("acme", keys["helper"][1]["id"]))["id"] == keys["helper"][1]["id"]
    assert [e["id"] for e in await store.revoke_member("acme", "dana")] == [keys["member"][1]["id"]]
    return keys


async def check_served(store: KeyStore, keys: dict[str, tuple[str, dict]]) -> None:
    for name in ("agent", "operator"):
        key, entry = keys[name]
        p = await store.resolve(key)
        assert p is not None, name
        assert (p.tenant, p.agent, p.role, p.key_id) == ("acme", entry["agent"], name, entry["id"])
    for name in ("helper", "member"):
        assert await store.resolve(keys[name][0]) is None, name


async def test_after_a_flushall_a_store_rebuilt_from_the_topic_accepts_the_live_keys_and_refuses_the_revoked(
        deployment, redis):
    async with api_process(deployment, redis) as store:
        keys = await issue_four(store)
        await check_served(store, keys)
    assert await redis.flushall()
    assert await redis_alone(deployment, redis).resolve(keys["agent"][0]) is None  # Redis holds nothing

    async with api_process(deployment, redis) as store:
        await check_served(store, keys)  # at once: the follower read the topic before serving
        assert [e["id"] for e in await store.list("acme")] == [keys["agent"][1]["id"], keys["operator"][1]["id"]]
        assert await store.revoke("acme", keys["helper"][1]["id"]) is None  # revoked stays revoked

        # The follower restores the Redis view itself: a store reading Redis alone serves the same.
        async def restored():
            return await ApiKeyView(redis, deployment.redis_root).restored()

        await eventually(restored, timeout=10)
        await check_served(redis_alone(deployment, redis), keys)
        assert len(await redis_alone(deployment, redis).list("acme")) == 2

    # The log holds digests and public entries, never a key.
    async with TopicReader(deployment) as c:
        logged = await c.read_all([TopicPartition(deployment.topic(API_KEYS.name), 0)])
    assert len(logged) == 6  # four issues, two revocations
    for m in logged:
        assert m.value is not None  # no tombstones: compaction keeps every revocation
        raw = m.key + m.value
        assert not any(key.encode() in raw for key, _ in keys.values())
    revoked = {json.loads(m.value)["hash"] for m in logged if json.loads(m.value)["revoked"]}
    assert revoked == {key_digest(keys["helper"][0]), key_digest(keys["member"][0])}


async def test_a_listing_that_races_the_views_restore_still_names_every_live_key(deployment, redis):
    async with api_process(deployment, redis) as store:
        keys = await issue_four(store)
    assert await redis.flushall()
    log = ApiKeyLog(deployment, ApiKeyView(redis, deployment.redis_root))
    await log.start(follow=False)  # the book alone: the test restores the view at the worst moment
    try:
        store = KeyStore(redis, BOOT, deployment.redis_root, log=log)
        read_rows = store.view.rows

        async def rows_then_restored(tenant):
            got = await read_rows(tenant)
            await log.restore()  # the follower finishes restoring between the listing's two reads
            return got

        store.view.rows = rows_then_restored  # type: ignore[method-assign]
        assert [e["id"] for e in await store.list("acme")] == [keys["agent"][1]["id"], keys["operator"][1]["id"]]
    finally:
        await log.stop()


async def test_a_running_process_serves_every_key_through_a_flushall_and_restores_the_view(deployment, redis):
    async with api_process(deployment, redis) as store:
        keys = await issue_four(store)
        restores = store.log.restores
        assert await redis.flushall()
        # No window of refusals: a key Redis lost is answered from the follower's book.
        await check_served(store, keys)
        # A revocation while the view is gone still finds the key (by id, in the book) and holds.
        assert (await store.revoke("acme", keys["operator"][1]["id"]))["role"] == "operator"
        assert await store.resolve(keys["operator"][0]) is None

        alone = redis_alone(deployment, redis)

        async def restored():
            # A restore that began before the revocation may list the key again until the
            # follower reads the revocation back and takes it out: hence the list in the wait.
            return (store.log.restores > restores and await store.view.restored()
                    and [e["role"] for e in await alone.list("acme")] == ["agent"])

        await eventually(restored, timeout=10)
        assert (await alone.resolve(keys["agent"][0])).role == "agent"
        for name in ("operator", "helper", "member"):
            assert await alone.resolve(keys[name][0]) is None, name


async def test_a_revoked_key_copied_back_into_redis_stays_refused(deployment, redis):
    # Redis restored from a backup taken before the revocation: the log's book refuses the key
    # whatever Redis says, and the follower writes the revocation over the copy when it starts.
    async with api_process(deployment, redis) as store:
        key, entry = await store.issue("acme", "bot", "agent")
        name = store.view.key(key_digest(key))
        copy = await redis.get(name)
        await store.revoke("acme", entry["id"])
    await redis.set(name, copy)
    assert await redis_alone(deployment, redis).resolve(key) is not None  # the stale copy works on Redis alone

    book_only = ApiKeyLog(deployment, ApiKeyView(redis, deployment.redis_root))
    await book_only.start(follow=False)  # nothing writes Redis
    try:
        assert await KeyStore(redis, BOOT, deployment.redis_root, log=book_only).resolve(key) is None
        assert await redis_alone(deployment, redis).resolve(key) is not None
    finally:
        await book_only.stop()

    async with api_process(deployment, redis):
        async def healed():
            return await redis_alone(deployment, redis).resolve(key) is None

        await eventually(healed, timeout=10)


async def test_keys_issued_before_the_log_are_adopted_and_a_revocation_wins(deployment, redis):
    # A key as Redis held it before keys had ids, and before the log held keys.
    legacy = "ml_a_legacy-key-issued-long-ago"
    view = ApiKeyView(redis, deployment.redis_root)
    await redis.set(view.key(key_digest(legacy)), json.dumps({"tenant": "acme", "agent": "old", "role": "agent"}))
    async with api_process(deployment, redis) as store:
        await eventually(view.restored, timeout=10)
        assert (await store.resolve(legacy)).agent == "old"
        listed = await store.list("acme")
        assert [(e["id"], e["agent"]) for e in listed] == [(key_digest(legacy)[:16], "old")]
    assert await redis.flushall()
    async with api_process(deployment, redis) as store:
        assert (await store.resolve(legacy)).agent == "old"  # adopted: on the log
        await store.revoke("acme", key_digest(legacy)[:16])
    assert await redis.flushall()
    async with api_process(deployment, redis) as store:
        assert await store.resolve(legacy) is None


@asynccontextmanager
async def web_sessions(s: Settings, client, store: KeyStore):
    """What an API process holds of its web sessions: the Redis view and the log's follower."""
    log = WebSessionLog(s)
    await log.start()
    try:
        yield WebSessions(client, store, s.redis_root, log)
    finally:
        await log.stop()


async def test_web_sessions_outlive_a_flushall_and_a_signed_out_or_revoked_one_stays_out(deployment, redis):
    """Sign-ins and sign-outs go to `memlane.websessions` first: after Redis lost everything, a
    process started afterwards (its book read from the topic) and the running one both serve the
    live session, with its CSRF token, and put it back in Redis for the rest of its life; the
    signed-out session stays out, and so does a session whose key is revoked afterwards."""
    async with api_process(deployment, redis) as store, web_sessions(deployment, redis, store) as web:
        member, _ = await store.issue("acme", None, "member", "dana")
        operator, entry = await store.issue("acme", None, "operator")
        signed_in = await web.sign_in(member)
        left = await web.sign_in(operator)
        assert isinstance(signed_in, tuple) and isinstance(left, tuple)
        (sid, session), (gone, _) = signed_in, left
        await web.sign_out(gone)
        await redis.flushall()

        async with api_process(deployment, redis) as later_store, web_sessions(deployment, redis, later_store) as later:
            back = await later.get(sid)
            assert back is not None and (back.csrf, back.principal.user) == (session.csrf, "dana")
            assert 0 < await redis.pttl(f"{deployment.redis_root}websession:{session_hash(sid)}") <= SESSION_TTL_S * 1000
            assert await later.get(gone) is None
        await redis.flushall()
        again = await web.get(sid)  # the running process's own book
        assert again is not None and again.csrf == session.csrf

        await store.revoke_member("acme", "dana")
        assert await web.get(sid) is None
        await redis.flushall()
        async with api_process(deployment, redis) as later_store, web_sessions(deployment, redis, later_store) as later:
            assert await later.get(sid) is None
