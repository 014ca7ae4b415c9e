"""Tenant and platform memory for the API (docs/features/tenant-platform-memory.md): the administrators'
commands and listings, and recall's layer source.

Who: a tenant's conventions and floors are administered by an operator key of that tenant (the
deployment's own key names the tenant with X-Tenant); platform entries by the deployment's own
operator key only (`Principal.deployment`), never a key issued to a tenant. Agent, helper and
member keys read none of the listings; their agents get the entries in recall.

Recall reads the tenant's hash and the platform's from the view, cached per tenant for
`CACHE_S` in this process: they change rarely, and a recall should not open twenty sealed texts
each time. A change reaches recall within that time after the view shows it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from events.base import utcnow
from events.commands import (
    PLATFORM,
    WORKSPACE,
    DecideConvention,
    RemovePlatformEntry,
    RemoveTenantFloor,
    SetPlatformEntry,
    SetTenantFloor,
)
from events.errors import ErrorCode
from events.record import Provenance, Source
from events.rules import conventions
from events.rules.recall_render import Entry
from projections.redis.shared_view import STATUSES, Item, SharedView
from services.auth import Principal
from services.errors import ApiError
from services.memory.ports import RecallAsk
from services.memory.rules import check_role

if TYPE_CHECKING:
    from services.memory.commands import MemoryCommands

CACHE_S = 1.0  # how long recall reuses a tenant's and the platform's entries
CACHE_TENANTS = 10_000  # past this many cached tenants, the stale ones are dropped


def check_platform_operator(p: Principal, what: str) -> None:
    """Only the deployment's own operator key changes platform memory."""
    check_role(p, ("operator",), what)
    if not p.deployment:
        raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"only the platform operator (the deployment's own "
                       f"MEMLANE_OPERATOR_KEY) can {what}; a tenant's operator key cannot", 403)


class TenantMemory:
    def __init__(self, commands: MemoryCommands) -> None:
        self.commands = commands
        self.view = SharedView(commands.records)
        self._cache: dict[str, tuple[float, Any]] = {}

    # ------------------------------------------------------------------ commands

    def _command(self, cls: type, p: Principal, tenant: str, **fields: Any) -> Any:
        return cls(command_id=str(uuid.uuid4()), tenant=tenant, agent=WORKSPACE, issued_at=utcnow(),
                   provenance=Provenance(source=Source.OPERATOR, modified_by=f"operator:{p.key_id or 'deployment'}"),
                   **fields)

    async def _submit(self, cmd: Any, shown: Any, what: str, wait: bool) -> dict[str, Any]:
        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self.commands._rejected(events)
            await self.commands._until(cmd, shown, what)
            self._cache.clear()  # this process's next recall reads the change at once
            return {"command_id": cmd.command_id, "status": "applied"}

        return await self.commands.submit(cmd, wait, outcome)

    async def decide(self, p: Principal, tenant: str, cid: str, decision: str, wait: bool = True) -> dict[str, Any]:
        check_role(p, ("operator",), "approve or reject a tenant convention")
        cmd = self._command(DecideConvention, p, tenant, convention=cid, decision=decision)
        want = "approved" if decision == "approve" else "rejected"

        async def shown() -> bool:
            return any(c.id == cid and c.status == want for c in (await self.view.tenant(tenant)).conventions)

        return {**await self._submit(cmd, shown, f"convention {cid} {want}", wait), "id": cid, "convention": want}

    async def set_floor(self, p: Principal, tenant: str, fid: str, text: str, wait: bool = True) -> dict[str, Any]:
        check_role(p, ("operator",), "set a tenant floor")
        cmd = self._command(SetTenantFloor, p, tenant, floor=fid, text=text)

        async def shown() -> bool:
            return any(f.id == fid and f.text == text for f in (await self.view.tenant(tenant)).floors)

        return {**await self._submit(cmd, shown, f"floor {fid}", wait), "id": fid}

    async def remove_floor(self, p: Principal, tenant: str, fid: str, wait: bool = True) -> dict[str, Any]:
        check_role(p, ("operator",), "remove a tenant floor")
        cmd = self._command(RemoveTenantFloor, p, tenant, floor=fid)

        async def shown() -> bool:
            return all(f.id != fid for f in (await self.view.tenant(tenant)).floors)

        return {**await self._submit(cmd, shown, f"floor {fid} removed", wait), "id": fid}

    async def set_platform(self, p: Principal, eid: str, kind: str, text: str, wait: bool = True) -> dict[str, Any]:
        check_platform_operator(p, "change platform memory")
        cmd = self._command(SetPlatformEntry, p, PLATFORM, entry=eid, kind=kind, text=text)

        async def shown() -> bool:
            return any(e.id == eid and e.kind == kind and e.text == text for e in await self.view.platform())

        return {**await self._submit(cmd, shown, f"platform entry {eid}", wait), "id": eid}

    async def remove_platform(self, p: Principal, eid: str, wait: bool = True) -> dict[str, Any]:
        check_platform_operator(p, "change platform memory")
        cmd = self._command(RemovePlatformEntry, p, PLATFORM, entry=eid)

        async def shown() -> bool:
            return all(e.id != eid for e in await self.view.platform())

        return {**await self._submit(cmd, shown, f"platform entry {eid} removed", wait), "id": eid}

    # ------------------------------------------------------------------ listings

    async def conventions(self, p: Principal, tenant: str, status: str | None) -> list[Item]:
        check_role(p, ("operator",), "list a tenant's conventions")
        return (await self.view.tenant(tenant, (status,) if status else STATUSES)).conventions

    async def floors(self, p: Principal, tenant: str) -> list[Item]:
        check_role(p, ("operator",), "list a tenant's floors")
        return (await self.view.tenant(tenant)).floors

    async def platform(self, p: Principal) -> list[Item]:
        check_role(p, ("operator",), "list platform memory")
        return await self.view.platform()

    # ------------------------------------------------------------------ recall

    async def _cached(self, key: str, read: Any) -> Any:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        value = await read()
        if len(self._cache) >= CACHE_TENANTS:  # stale entries of tenants not seen since go
            self._cache = {k: v for k, v in self._cache.items() if now - v[0] < CACHE_S}
        self._cache[key] = (now, value)
        return value

    async def layers(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """Recall's layer source: the platform's policies and defaults for every tenant, the
        caller's own tenant's floors, and its approved conventions that share most words with
        the turn's text. Nothing of any other tenant: the tenant is the key's."""
        tenant = ask.ctx.tenant
        mine, platform = await asyncio.gather(self._cached(f"t:{tenant}", lambda: self.view.tenant(tenant, ("approved",))),
                                              self._cached("p", self.view.platform))
        approved = [Entry(c.id, c.text) for c in mine.conventions if c.status == "approved"]
        return {
            "Policy": [Entry(e.id, e.text) for e in platform if e.kind == "policy"],
            "Tenant floors": [Entry(f.id, f.text) for f in mine.floors],
            "Tenant conventions": conventions.rank(approved, ask.text),
            "Defaults": [Entry(e.id, e.text) for e in platform if e.kind == "default"],
        }
