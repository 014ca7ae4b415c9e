"""Web sessions on a real Redis: a session stands for its key until the key is revoked or
the member signs out, and Redis never holds the key or the cookie's value."""

from __future__ import annotations

import uuid

from redis import asyncio as aioredis

from services.auth import KeyStore
from services.http.sessions import WebSessions


async def test_a_session_follows_its_key_and_ends_with_a_sign_out_or_a_revocation(settings):
    r = aioredis.from_url(settings.redis_url, decode_responses=True)
    root = f"ml:websess{uuid.uuid4().hex[:8]}:"
    keys = KeyStore(r, "the-deployment-key", root)
    sessions = WebSessions(r, keys, root)
    try:
        key, entry = await keys.issue("acme", "helpdesk", "member", "alice")
        assert await sessions.sign_in("not a key") is None
        sid, made = await sessions.sign_in(key)
        again = await sessions.get(sid)
        assert (again.principal.role, again.principal.user, again.csrf) == ("member", "alice", made.csrf)
        stored = {k: await r.get(k) for k in await r.keys(f"{root}websession:*")}
        assert len(stored) == 1 and not any(key in v or sid in v or sid in k for k, v in stored.items())

        deployment_sid, _ = await sessions.sign_in("the-deployment-key")
        assert (await sessions.get(deployment_sid)).principal.deployment is True
        assert await sessions.get(sid + "x") is None and await sessions.get(None) is None

        # A program's key (an agent's, a helper's) gets no session: only people sign in.
        for role in ("agent", "helper"):
            program, _ = await keys.issue("acme", "helpdesk", role)
            assert (await sessions.sign_in(program)).role == role
        assert len(await r.keys(f"{root}websession:*")) == 2

        await keys.revoke("acme", entry["id"])
        assert await sessions.get(sid) is None  # a revoked key's sessions end with it
        await sessions.sign_out(deployment_sid)
        assert await sessions.get(deployment_sid) is None
    finally:
        await r.delete(*(await r.keys(f"{root}*") or ["-"]))
        await r.aclose()
