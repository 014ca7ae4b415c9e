"""API keys: each bound to a tenant and an agent, with a role.

- `agent`: the agent itself; reads and writes its own memory.
- `helper`: a subagent or programmatic caller of that agent; searches, never writes.
- `operator`: administers keys and configuration for any agent of its tenant; erases a
  member's memory and sees counts, but never reads the text of a member's user-scope facts.
- `member`: one member (tenant + user) of one agent, or of every agent of the tenant; lists,
  reads, edits and deletes that member's own user-scope facts and grants or withdraws consent.

Keys are stored hashed: only a key's digest (SHA-256) and its public entry (id, agent, role,
a member key's user, creation time) are kept, never the key. The log is their source of truth,
as it is for memory: `memlane.apikeys` holds every key and every revocation (events/api_keys.py),
and Redis holds a view of it under the deployment's root (`ml:<topic prefix>`, so two
deployments sharing one Redis never accept each other's keys; projections/redis/api_key_view.py).
Issuing and revoking write the log first (acks=all), then Redis, and answer after both; the
API process's follower (workers/followers/api_keys_follower.py) restores the view when Redis loses it, and until
then its book answers for a key Redis lacks (docs/features/api-keys.md). The bootstrap operator key
comes from settings and is never stored.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import redis.asyncio as aioredis

from events.api_keys import KeyRecord, key_id
from events.base import utcnow
from projections.redis.api_key_view import ApiKeyView

if TYPE_CHECKING:
    from workers.followers.api_keys_follower import ApiKeyLog

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


class KeyStorePort(Protocol):
    """What the API asks of its key store (`KeyStore`; tests/fakes/keys.py in unit tests)."""

    async def issue(self, tenant: str, agent: str | None, role: Role, user: str | None = None
                    ) -> tuple[str, dict[str, Any]]: ...

    async def resolve(self, key: str | None) -> Principal | None: ...

    async def list(self, tenant: str) -> builtins.list[dict[str, Any]]: ...

    async def revoke(self, tenant: str, kid: str) -> dict[str, Any] | None: ...

    async def revoke_member(self, tenant: str, user: str) -> builtins.list[dict[str, Any]]: ...


class KeyStore:
    """`log` None: Redis alone (tests of what is above the store); the API passes its follower."""

    def __init__(self, client: aioredis.Redis, operator_key: str, root: str = "ml:", operator_tenant: str = "*",
                 log: ApiKeyLog | None = None) -> None:
        self.r = client
        self.operator_key = operator_key.encode("utf-8", "surrogatepass")
        self.operator_tenant = operator_tenant
        self.root = root
        self.view = ApiKeyView(client, root)
        self.log = log

    async def _write(self, rec: KeyRecord) -> None:
        # The log first: a key or a revocation the caller hears of is never lost with Redis.
        if self.log is not None:
            await self.log.append(rec)
        await self.view.put(rec)

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
        await self._write(KeyRecord(digest, entry))
        return key, entry

    async def resolve(self, key: str | None) -> Principal | None:
        return await self.resolve_digest(_hash(key)) if key else None

    async def resolve_digest(self, digest: str) -> Principal | None:
        """The key whose hash is `digest` (a signed-in web session holds the hash, never the key).
        One Redis GET; the log's book is read in memory, for a key Redis lacks (lost with its
        data, until the follower restores it) and for a revocation Redis does not show (a copy
        from before it)."""
        if self.operator_key and secrets.compare_digest(digest, hashlib.sha256(self.operator_key).hexdigest()):
            return Principal(self.operator_tenant, None, "operator", deployment=True)
        d = await self.view.get(digest)
        logged = self.log.get(digest) if self.log is not None else None
        if d is None:
            if logged is None or logged.revoked is not None:
                return None
            assert self.log is not None
            self.log.suspect.set()  # the follower checks the view at once
            d = dict(logged.entry)
        elif d.get("revoked") or (logged is not None and logged.revoked is not None):
            return None
        # A key issued before keys had ids has none stored: its id is the start of its hash.
        return Principal(d["tenant"], d.get("agent"), d["role"], d.get("id") or key_id(digest), d.get("user"))

    async def _rows(self, tenant: str) -> builtins.list[dict[str, Any]]:
        """The tenant's working keys, each its entry and digest (`hash`): Redis's index, and the
        log's while the view is not restored; never one the log says is revoked."""
        if self.log is None:
            return list((await self.view.rows(tenant)).values())
        # The mark first: read after it, rows the mark says are whole are whole, though the
        # follower finishes restoring the view between the two reads.
        restored = await self.view.restored()
        rows = await self.view.rows(tenant)
        if not restored:
            for rec in self.log.book.live(tenant):
                rows.setdefault(rec.id, {**rec.entry, "hash": rec.digest})
        return [row for row in rows.values() if not self._revoked(row["hash"])]

    def _revoked(self, digest: str) -> bool:
        logged = self.log.get(digest) if self.log is not None else None
        return logged is not None and logged.revoked is not None

    async def list(self, tenant: str) -> builtins.list[dict[str, Any]]:
        """The tenant's keys, oldest first: id, tenant, agent, role, created, and a member key's
        user. Never a key or its hash."""
        out = [{k: v for k, v in row.items() if k != "hash"} for row in await self._rows(tenant)]
        return sorted(out, key=lambda e: (e.get("created") or "", e["id"]))

    async def _revoke(self, row: dict[str, Any]) -> dict[str, Any]:
        entry = {k: v for k, v in row.items() if k != "hash"}
        await self._write(KeyRecord(row["hash"], entry, revoked=utcnow().isoformat()))
        return entry

    async def revoke_member(self, tenant: str, user: str) -> builtins.list[dict[str, Any]]:
        """Revokes every member key of `user` in the tenant at once (the member was removed);
        the revoked keys' public entries, oldest first."""
        mine = [row for row in await self._rows(tenant) if row.get("role") == "member" and row.get("user") == user]
        out = [await self._revoke(row) for row in mine]
        return sorted(out, key=lambda e: (e.get("created") or "", e["id"]))

    async def revoke(self, tenant: str, kid: str) -> dict[str, Any] | None:
        """Revokes the tenant's key with this id at once; None when the tenant has no such key."""
        row = await self.view.row(tenant, kid)
        if row is None and self.log is not None:
            rec = self.log.book.find(tenant, kid)  # Redis may have lost it
            row = None if rec is None else {**rec.entry, "hash": rec.digest}
        if row is None or self._revoked(row["hash"]):
            return None
        return await self._revoke(row)
