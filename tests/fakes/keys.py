"""An in-memory key store for unit tests of what is above the store (routes, dependencies),
held to the store's port by the type checker and by the contract suite the Redis-backed store
runs (tests/contract/test_key_store.py)."""

from __future__ import annotations

import builtins
import hashlib
import itertools
from collections.abc import Callable
from typing import Any

from services.auth import KeyStorePort, Principal, Role

_clock = itertools.count()


class InMemoryKeyStore:
    def __init__(self, operator_key: str = "", operator_tenant: str = "*") -> None:
        self.operator_key, self.operator_tenant = operator_key, operator_tenant
        self.entries: dict[str, dict[str, Any]] = {}  # key -> public entry, a revoked one marked
        self.issued: list[tuple[str, str | None, Role, str | None]] = []

    def add(self, key: str, tenant: str, agent: str | None, role: Role, user: str | None = None) -> dict[str, Any]:
        """A key of the test's choosing (a fixed string its requests send)."""
        entry = {"id": hashlib.sha256(key.encode()).hexdigest()[:12], "tenant": tenant, "agent": agent,
                 "role": role, "created": f"{next(_clock):012d}", **({"user": user} if user else {})}
        self.entries[key] = entry
        return dict(entry)

    async def issue(self, tenant: str, agent: str | None, role: Role, user: str | None = None
                    ) -> tuple[str, dict[str, Any]]:
        if (role == "member") != (user is not None):
            raise ValueError("a member key names its user, and only a member key does")
        self.issued.append((tenant, agent, role, user))
        key = f"ml_{role[0]}_{len(self.entries)}_{next(_clock)}"
        return key, self.add(key, tenant, agent, role, user)

    async def resolve(self, key: str | None) -> Principal | None:
        if not key:
            return None
        if self.operator_key and key == self.operator_key:
            return Principal(self.operator_tenant, None, "operator", deployment=True)
        e = self.entries.get(key)
        if e is None or e.get("revoked"):
            return None
        return Principal(e["tenant"], e["agent"], e["role"], e["id"], e.get("user"))

    def _live(self, tenant: str) -> builtins.list[dict[str, Any]]:
        return [e for e in self.entries.values() if e["tenant"] == tenant and not e.get("revoked")]

    async def list(self, tenant: str) -> builtins.list[dict[str, Any]]:
        return sorted((dict(e) for e in self._live(tenant)), key=lambda e: (e["created"], e["id"]))

    async def revoke(self, tenant: str, kid: str) -> dict[str, Any] | None:
        revoked = self._revoke(tenant, lambda e: e["id"] == kid)
        return revoked[0] if revoked else None

    async def revoke_member(self, tenant: str, user: str) -> builtins.list[dict[str, Any]]:
        return self._revoke(tenant, lambda e: e["role"] == "member" and e.get("user") == user)

    def _revoke(self, tenant: str, which: Callable[[dict[str, Any]], bool]) -> builtins.list[dict[str, Any]]:
        """The tenant's live keys `which` picks, revoked; their public entries, oldest first."""
        out = []
        for e in self._live(tenant):
            if which(e):
                out.append(dict(e))
                e["revoked"] = True
        return sorted(out, key=lambda e: (e["created"], e["id"]))


def _implements(s: InMemoryKeyStore) -> KeyStorePort:
    return s  # the type checker holds the fake to the port
