"""Web sign-in: a session cookie in place of the key, so the page never shows or stores a key
in the URL or in the browser.

A session holds the key's hash (what `KeyStore` indexes keys by, so a revoked key ends its
sessions at once) and a CSRF token. The cookie is HttpOnly and SameSite=Strict; an API call
authenticated by it must also send the token in `X-CSRF-Token`, which only the page's own
script can read (from the page), so another site cannot make a signed-in browser call the API.
Every command names one key, so sessions need nothing more on a Redis Cluster.

Like the keys they stand for, sessions go to a log first (`memlane.websessions`, through
`WebSessionLog`), then to Redis: a Redis that lost its data has them back from the log as they
are asked for. The log keeps a session only for its life (8 hours), never the cookie itself.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from events.topics import WEB_SESSION_TTL_S as SESSION_TTL_S
from events.web_sessions import SessionRecord, session_hash
from services.auth import KeyStore, Principal, key_digest

if TYPE_CHECKING:
    from workers.followers.web_sessions_follower import WebSessionLog

COOKIE = "memlane_session"
CSRF_HEADER = "x-csrf-token"
# The keys a person signs in with: a member's (their facts) and an operator's (their agents). An
# agent's or a helper's key is a program's; its session would carry it to the API by cookie.
WEB_ROLES = frozenset({"member", "operator"})


@dataclass(frozen=True)
class WebSession:
    principal: Principal
    csrf: str


class WebSessions:
    def __init__(self, client: aioredis.Redis, keys: KeyStore, root: str = "ml:", log: WebSessionLog | None = None) -> None:
        self.r, self.keys, self.root, self.log = client, keys, root, log

    def _key(self, sid: str) -> str:
        # Stored under the session id's hash: a Redis dump does not hand out live cookies.
        return f"{self.root}websession:{session_hash(sid)}"

    async def sign_in(self, key: str) -> tuple[str, WebSession] | Principal | None:
        """A new session for `key`: the cookie's value and the session; the key's principal
        when its role does not sign in (`WEB_ROLES`); None for no such key."""
        p = await self.keys.resolve(key)
        if p is None or p.role not in WEB_ROLES:
            return p
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        if self.log is not None:
            await self.log.append(session_hash(sid), SessionRecord(key_digest(key), csrf, time.time() + SESSION_TTL_S))
        await self.r.set(self._key(sid), json.dumps({"key": key_digest(key), "csrf": csrf}), ex=SESSION_TTL_S)
        return sid, WebSession(p, csrf)

    async def get(self, sid: str | None) -> WebSession | None:
        if not sid or len(sid) > 128:
            return None
        raw = await self.r.get(self._key(sid))
        if raw:
            d = json.loads(raw)
        elif self.log is not None and (rec := self.log.get(session_hash(sid))) is not None:
            # Redis lost it: back from the log, for the rest of its life.
            d = {"key": rec.key, "csrf": rec.csrf}
            await self.r.set(self._key(sid), json.dumps(d), px=max(1, int(rec.left_s() * 1000)))
        else:
            return None
        p = await self.keys.resolve_digest(d["key"])
        return None if p is None or p.role not in WEB_ROLES else WebSession(p, d["csrf"])

    async def sign_out(self, sid: str | None) -> None:
        if sid:
            if self.log is not None:
                await self.log.append(session_hash(sid), None)
            await self.r.delete(self._key(sid))
