"""API keys: each bound to a tenant and an agent, with a role.

- `agent`: the agent itself; reads and writes its own memory.
- `helper`: a subagent or programmatic caller of that agent; searches, never writes.
- `operator`: administers keys and configuration for any agent of its tenant; erases a
  member's memory and sees counts, but never reads the text of a member's user-scope facts.
- `member`: one member (tenant + user) of one agent, or of every agent of the tenant; lists,
  reads, edits and deletes that member's own user-scope facts and grants or withdraws consent.

Keys are stored hashed in Redis under the deployment's root (`ml:<topic prefix>`), so two
deployments sharing one Redis never accept each other's keys. Each tenant has an index of
its keys (id, agent, role, a member key's user, creation time; never the key) for listing and
revoking. The bootstrap operator key comes from settings and is never stored.

A key (`apikey:<hash>`) and its index entry (`apikeys:<tenant>`) change in one MULTI/EXEC on
one Redis server. On a Redis Cluster they are in different slots (a key is looked up by its
hash alone, before its tenant is known), so they change one after the other, in the order
that never leaves a working key out of its tenant's index: the entry goes in before the key
and comes out after it. The key names are as they were before clusters: no issued key moves.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from events.base import utcnow
from projections.redis_client import write_then

Role = Literal["agent", "helper", "operator", "member"]


@dataclass(frozen=True)
class Principal:
    tenant: str
    agent: str | None
    role: Role
    key_id: str | None = None
    user: str | None = None  # a member key's member
    # The deployment's own operator key (settings, never stored): set by `KeyStore.resolve`
    # alone, so no issued key, whatever its entry holds, is ever taken for it.
    deployment: bool = False

    @property
    def can_write(self) -> bool:
        """Whether the key makes the agent's tool writes (add, pin, curate, report, delete).
        A member key is not the agent: it edits and deletes its own facts, grants and
        withdraws consent, and never adds a record or uses an agent tool."""
        return self.role in ("agent", "operator")

    @property
    def is_member(self) -> bool:
        return self.role == "member"


def _hash(key: str) -> str:
    # surrogatepass: a key is whatever the caller sent; one that cannot be UTF-8 still hashes (and matches nothing).
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


key_digest = _hash


def key_id(digest: str) -> str:
    """A key's public id: the start of its hash, enough to name it, useless to use it."""
    return digest[:16]


class KeyStore:
    def __init__(self, client: aioredis.Redis, operator_key: str, root: str = "ml:", operator_tenant: str = "*") -> None:
        self.r = client
        self.operator_key = operator_key.encode("utf-8", "surrogatepass")
        self.operator_tenant = operator_tenant
        self.root = root

    def _key(self, digest: str) -> str:
        return f"{self.root}apikey:{digest}"

    def _index(self, tenant: str) -> str:
        return f"{self.root}apikeys:{tenant}"

    async def issue(self, tenant: str, agent: str | None, role: Role, user: str | None = None
                    ) -> tuple[str, dict[str, Any]]:
        """A new key and its public entry (what `list` shows). A member key names its member
        (`user`), and its agent or None for every agent of the tenant; no other key names a user."""
        if (role == "member") != (user is not None):
            raise ValueError("a member key names its user, and only a member key does")
        key = f"ml_{role[0]}_{secrets.token_urlsafe(24)}"
        digest = _hash(key)
        entry = {"id": key_id(digest), "tenant": tenant, "agent": agent, "role": role, "created": utcnow().isoformat()}
        if user is not None:
            entry["user"] = user
        await write_then(self.r, lambda p: p.hset(self._index(tenant), entry["id"], json.dumps({**entry, "hash": digest})),
                         lambda p: p.set(self._key(digest), json.dumps(entry)))
        return key, entry

    async def resolve(self, key: str | None) -> Principal | None:
        return await self.resolve_digest(_hash(key)) if key else None

    async def resolve_digest(self, digest: str) -> Principal | None:
        """The key whose hash is `digest` (a signed-in web session holds the hash, never the key)."""
        if self.operator_key and secrets.compare_digest(digest, hashlib.sha256(self.operator_key).hexdigest()):
            return Principal(self.operator_tenant, None, "operator", deployment=True)
        raw = await self.r.get(self._key(digest))
        if not raw:
            return None
        d = json.loads(raw)
        if "id" not in d:
            # Issued before keys had ids: it joins its tenant's index the first time it is used.
            d = {**d, "id": key_id(digest), "created": None}
            await write_then(self.r, lambda p: p.hset(self._index(d["tenant"]), d["id"], json.dumps({**d, "hash": digest})),
                             lambda p: p.set(self._key(digest), json.dumps(d)))
        return Principal(d["tenant"], d.get("agent"), d["role"], d["id"], d.get("user"))

    async def list(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's keys, oldest first: id, tenant, agent, role, created, and a member key's
        user. Never a key or its hash."""
        rows = [json.loads(v) for v in (await self.r.hgetall(self._index(tenant))).values()]
        out = [{k: v for k, v in row.items() if k != "hash"} for row in rows]
        return sorted(out, key=lambda e: (e.get("created") or "", e["id"]))

    # `builtins.list`: the method `list` above shadows the builtin in the class body.
    async def revoke_member(self, tenant: str, user: str) -> builtins.list[dict[str, Any]]:
        """Revokes every member key of `user` in the tenant at once (the member was removed);
        the revoked keys' public entries, oldest first."""
        rows = [json.loads(v) for v in (await self.r.hgetall(self._index(tenant))).values()]
        mine = [row for row in rows if row.get("role") == "member" and row.get("user") == user]
        if mine:
            def keys(p: Any) -> None:
                for row in mine:
                    p.delete(self._key(row["hash"]))

            await write_then(self.r, keys, lambda p: p.hdel(self._index(tenant), *[row["id"] for row in mine]))
        out = [{k: v for k, v in row.items() if k != "hash"} for row in mine]
        return sorted(out, key=lambda e: (e.get("created") or "", e["id"]))

    async def revoke(self, tenant: str, kid: str) -> dict[str, Any] | None:
        """Revokes the tenant's key with this id at once; None when the tenant has no such key."""
        raw = await self.r.hget(self._index(tenant), kid)
        if raw is None:
            return None
        entry = json.loads(raw)
        digest = entry.pop("hash")
        await write_then(self.r, lambda p: p.delete(self._key(digest)), lambda p: p.hdel(self._index(tenant), kid))
        return entry
