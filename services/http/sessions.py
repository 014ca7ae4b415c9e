"""Web sign-in: a session cookie in place of the key, so the page never shows or stores a key
in the URL or in the browser.

A session holds the key's hash (what `KeyStore` indexes keys by, so a revoked key ends its
sessions at once) and a CSRF token. The cookie is HttpOnly and SameSite=Strict; an API call
authenticated by it must also send the token in `X-CSRF-Token`, which only the page's own
script can read (from the page), so another site cannot make a signed-in browser call the API.
Every command names one key, so sessions need nothing more on a Redis Cluster.

Sessions, unlike the keys they stand for, live in Redis alone: they last 8 hours, and one
lost with Redis costs its member a sign-in with the key, which the log keeps. On the log they
would put every live session's CSRF token on a topic kept for good (docs/api-keys.md).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from services.auth import KeyStore, Principal, key_digest

COOKIE = "memlane_session"
CSRF_HEADER = "x-csrf-token"
SESSION_TTL_S = 8 * 3600
# The keys a person signs in with: a member's (their facts) and an operator's (their agents). An
# agent's or a helper's key is a program's; its session would carry it to the API by cookie.
WEB_ROLES = frozenset({"member", "operator"})


@dataclass(frozen=True)
class WebSession:
    principal: Principal
    csrf: str


class WebSessions:
    def __init__(self, client: aioredis.Redis, keys: KeyStore, root: str = "ml:") -> None:
        self.r, self.keys, self.root = client, keys, root

    def _key(self, sid: str) -> str:
        # Stored under the session id's hash: a Redis dump does not hand out live cookies.
        return f"{self.root}websession:{hashlib.sha256(sid.encode('utf-8', 'surrogatepass')).hexdigest()}"

    async def sign_in(self, key: str) -> tuple[str, WebSession] | Principal | None:
        """A new session for `key`: the cookie's value and the session; the key's principal
        when its role does not sign in (`WEB_ROLES`); None for no such key."""
        p = await self.keys.resolve(key)
        if p is None or p.role not in WEB_ROLES:
            return p
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        await self.r.set(self._key(sid), json.dumps({"key": key_digest(key), "csrf": csrf}), ex=SESSION_TTL_S)
        return sid, WebSession(p, csrf)

    async def get(self, sid: str | None) -> WebSession | None:
        if not sid or len(sid) > 128:
            return None
        raw = await self.r.get(self._key(sid))
        if not raw:
            return None
        d = json.loads(raw)
        p = await self.keys.resolve_digest(d["key"])
        return None if p is None or p.role not in WEB_ROLES else WebSession(p, d["csrf"])

    async def sign_out(self, sid: str | None) -> None:
        if sid:
            await self.r.delete(self._key(sid))
