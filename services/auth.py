"""API keys: each bound to a tenant and an agent, with a role.

- `agent`: the agent itself; reads and writes its own memory.
- `helper`: a subagent or programmatic caller of that agent; searches, never writes.
- `operator`: administers keys and configuration for any agent of its tenant.

Keys are stored hashed in Redis. The bootstrap operator key comes from settings.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

Role = Literal["agent", "helper", "operator"]


@dataclass(frozen=True)
class Principal:
    tenant: str
    agent: str | None
    role: Role

    @property
    def can_write(self) -> bool:
        return self.role in ("agent", "operator")


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    def __init__(self, client: aioredis.Redis, operator_key: str, operator_tenant: str = "*") -> None:
        self.r = client
        self.operator_key = operator_key
        self.operator_tenant = operator_tenant

    async def issue(self, tenant: str, agent: str | None, role: Role) -> str:
        key = f"ml_{role[0]}_{secrets.token_urlsafe(24)}"
        await self.r.set(f"ml:apikey:{_hash(key)}", json.dumps({"tenant": tenant, "agent": agent, "role": role}))
        return key

    async def resolve(self, key: str | None) -> Principal | None:
        if not key:
            return None
        if self.operator_key and secrets.compare_digest(key, self.operator_key):
            return Principal(self.operator_tenant, None, "operator")
        raw = await self.r.get(f"ml:apikey:{_hash(key)}")
        if not raw:
            return None
        d = json.loads(raw)
        return Principal(d["tenant"], d.get("agent"), d["role"])
