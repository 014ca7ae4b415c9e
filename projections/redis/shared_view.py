"""Redis adapter of tenant and platform memory (docs/features/tenant-platform-memory.md).

In the record view's generation namespace, so a rebuild fills it from the log like the rest:

- `tmem:{<tenant>/@workspace}`, one hash per tenant: `c:<id>` the convention's last
  `ConventionProposed` as logged (its text sealed under the tenant's workspace key), `s:<id>` its
  status (candidate, approved, rejected), `f:<id>` a floor's `TenantFloorSet` as logged;
- `pmem`, one hash for the platform: `p:<id>` a `PlatformEntrySet` as logged.

The redis-projection worker folds the events (`fold`) in the same pass as the records, before
the checkpoint; a tenant's removal (`SubjectErased`, tenant-wide) drops its hash (`purge_tenant`).
Folding is idempotent in log order: applied again from an older checkpoint, the same events
leave the same hashes. Reads open the texts (`opening`), skipping what no longer opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from events.codec import PLAIN, Codec
from events.commands import WORKSPACE
from events.topics import EVENTS
from projections.records import opening
from projections.redis.connection import agent_tag
from projections.redis.view_store import ViewStore

SHARED_EVENTS = ("ConventionProposed", "ConventionApproved", "ConventionRejected", "TenantFloorSet",
                 "TenantFloorRemoved", "PlatformEntrySet", "PlatformEntryRemoved")
STATUSES = ("candidate", "approved", "rejected")


class _Fields(msgspec.Struct, kw_only=True):
    """The fields the view keys by: never sealed, so read without opening."""

    type: str
    tenant: str
    entry_id: str


_FIELDS = msgspec.json.Decoder(_Fields, strict=False)


def tenant_key(ns: str, tenant: str) -> str:
    return f"{ns}:tmem:{agent_tag(f'{tenant}/{WORKSPACE}')}"


def platform_key(ns: str) -> str:
    return f"{ns}:pmem"


def fold(pipe: Any, ns: str, raw: bytes | str) -> None:
    """Queues on `pipe` what a logged tenant or platform event changes."""
    f = _FIELDS.decode(raw)
    tk, eid = tenant_key(ns, f.tenant), f.entry_id
    if f.type == "ConventionProposed":
        pipe.hset(tk, mapping={f"c:{eid}": raw, f"s:{eid}": "candidate"})
    elif f.type == "ConventionApproved":
        pipe.hset(tk, f"s:{eid}", "approved")
    elif f.type == "ConventionRejected":
        pipe.hset(tk, f"s:{eid}", "rejected")
    elif f.type == "TenantFloorSet":
        pipe.hset(tk, f"f:{eid}", raw)
    elif f.type == "TenantFloorRemoved":
        pipe.hdel(tk, f"f:{eid}")
    elif f.type == "PlatformEntrySet":
        pipe.hset(platform_key(ns), f"p:{eid}", raw)
    elif f.type == "PlatformEntryRemoved":
        pipe.hdel(platform_key(ns), f"p:{eid}")


async def purge_tenant(r: Any, ns: str, tenant: str) -> None:
    """A removed tenant's conventions and floors leave the view. Idempotent."""
    await r.delete(tenant_key(ns, tenant))


@dataclass(frozen=True)
class Item:
    """What a read shows of one entry: a convention (with its status and agents), a floor, or a
    platform entry (with its kind)."""

    id: str
    text: str
    status: str = ""  # a convention's
    agents: tuple[str, ...] = ()  # a convention's: the agents seen establishing it
    kind: str = ""  # a platform entry's: policy or default
    at: str = ""  # when it was last set or proposed

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.status:
            out |= {"status": self.status, "agents": list(self.agents)}
        if self.kind:
            out["kind"] = self.kind
        return out | {"updated_at": self.at}


@dataclass(frozen=True)
class TenantMemory:
    conventions: list[Item]
    floors: list[Item]


def _text(raw: bytes | str, codec: Codec) -> Any:
    return codec.decode(EVENTS.name, raw)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class SharedView:
    """Reads of tenant and platform memory, over the record view's client and generation."""

    def __init__(self, records: ViewStore) -> None:
        self.records = records

    async def _ns(self) -> str:
        return await self.records.namespace()

    async def tenant(self, tenant: str, statuses: tuple[str, ...] = STATUSES) -> TenantMemory:
        """The tenant's floors, and its conventions of `statuses` (recall opens the approved only:
        candidates pile up, and each is a sealed text to open)."""
        rec = self.records
        stored = {_s(k): v for k, v in (await rec.r.hgetall(tenant_key(await self._ns(), tenant))).items()}
        conventions, floors = [], []
        for field, raw in sorted(stored.items()):
            if field.startswith("c:"):
                status = _s(stored.get(f"s:{field[2:]}", "candidate"))
                if status in statuses and (e := await opening(rec.keys, _text, raw, rec.codec)) is not None:
                    conventions.append(Item(e.entry_id, e.text, status, tuple(e.agents), at=e.occurred_at.isoformat()))
            elif field.startswith("f:"):
                if (e := await opening(rec.keys, _text, raw, rec.codec)) is not None:
                    floors.append(Item(e.entry_id, e.text, at=e.occurred_at.isoformat()))
        return TenantMemory(conventions, floors)

    async def platform(self) -> list[Item]:
        rec = self.records
        out = []
        for _field, raw in sorted((await rec.r.hgetall(platform_key(await self._ns()))).items()):
            e = _text(raw, PLAIN)  # never sealed: the platform's own entries
            out.append(Item(e.entry_id, e.text, kind=e.kind, at=e.occurred_at.isoformat()))
        return out
