"""Tenant and platform memory (docs/features/tenant-platform-memory.md): a tenant administrator reviews
convention candidates and keeps the tenant's floors; the platform operator keeps the Policy and
Default entries every tenant's recall carries.

A tenant's routes take an operator key of that tenant (the deployment's own key names the tenant
with X-Tenant); the platform's writes take the deployment's own operator key only. Agent, helper
and member keys are refused (403): their agents get these entries in recall.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path
from pydantic import Field

from events.base import RUN_ID_PATTERN
from events.commands import ENTRY_ID_CHARS, SHARED_TEXT_CHARS
from events.errors import ErrorCode
from services.errors import ApiError
from services.http.deps import Caller, Svc, tenant_of
from services.http.models import Body
from services.memory.rules import check_role

router = APIRouter()

IdPath = Annotated[str, Path(min_length=1, max_length=ENTRY_ID_CHARS, pattern=RUN_ID_PATTERN,
                             description=f"the entry's id: 1-{ENTRY_ID_CHARS} letters, digits, '.', '_' or '-'")]
Text = Annotated[str, Field(min_length=1, max_length=SHARED_TEXT_CHARS,
                            description=f"the text, 1 to {SHARED_TEXT_CHARS} characters")]


class FloorRequest(Body):
    text: Text


class PlatformRequest(Body):
    kind: Literal["policy", "default"] = Field(description="policy: non-negotiable, right after blocks; "
                                               "default: an overridable convention, last")
    text: Text


def _tenant(p, x_tenant: str | None, what: str) -> str:
    """The tenant an operator key administers: its own, or for the deployment's key X-Tenant."""
    check_role(p, ("operator",), what)
    tenant = tenant_of(p, x_tenant)
    if tenant.startswith("@"):  # the platform's and the workspace's pseudo ids are no tenant
        raise ApiError(ErrorCode.VALIDATION_FAILED, "x-tenant", f"x-tenant: {tenant} is no tenant; name one", 422)
    return tenant


XTenant = Annotated[str | None, Header(description="the tenant, for the deployment's own operator key")]


@router.get("/v1/tenant/conventions")
async def list_conventions(p: Caller, s: Svc, x_tenant: XTenant = None,
                           status: Literal["candidate", "approved", "rejected"] | None = None):
    """The tenant's conventions: facts established in two or more of its agents, each with its
    status and the agents seen stating it. Operator keys only."""
    tenant = _tenant(p, x_tenant, "list a tenant's conventions")
    return {"conventions": [c.as_json() for c in await s.tenant.conventions(p, tenant, status)]}


@router.post("/v1/tenant/conventions/{convention_id}/approve")
async def approve_convention(convention_id: IdPath, p: Caller, s: Svc, x_tenant: XTenant = None, wait: bool = True):
    """Approves a convention: from then on in every recall of the tenant's agents (`tenantEntries`)."""
    tenant = _tenant(p, x_tenant, "approve a tenant convention")
    return await s.tenant.decide(p, tenant, convention_id, "approve", wait)


@router.post("/v1/tenant/conventions/{convention_id}/reject")
async def reject_convention(convention_id: IdPath, p: Caller, s: Svc, x_tenant: XTenant = None, wait: bool = True):
    """Rejects a convention (an approved one leaves recall): the same agents stating the fact
    again never propose it again; another agent stating it does."""
    tenant = _tenant(p, x_tenant, "reject a tenant convention")
    return await s.tenant.decide(p, tenant, convention_id, "reject", wait)


@router.get("/v1/tenant/floors")
async def list_floors(p: Caller, s: Svc, x_tenant: XTenant = None):
    """The tenant's floors: non-negotiable policies in every recall of its agents."""
    tenant = _tenant(p, x_tenant, "list a tenant's floors")
    return {"floors": [f.as_json() for f in await s.tenant.floors(p, tenant)]}


@router.put("/v1/tenant/floors/{floor_id}")
async def set_floor(floor_id: IdPath, body: FloorRequest, p: Caller, s: Svc, x_tenant: XTenant = None,
                    wait: bool = True):
    """Sets (or replaces) a floor: at most 20 per tenant, 500 characters each."""
    tenant = _tenant(p, x_tenant, "set a tenant floor")
    return await s.tenant.set_floor(p, tenant, floor_id, body.text, wait)


@router.delete("/v1/tenant/floors/{floor_id}")
async def remove_floor(floor_id: IdPath, p: Caller, s: Svc, x_tenant: XTenant = None, wait: bool = True):
    tenant = _tenant(p, x_tenant, "remove a tenant floor")
    return await s.tenant.remove_floor(p, tenant, floor_id, wait)


@router.get("/v1/platform/entries")
async def list_platform(p: Caller, s: Svc):
    """The platform's Policy and Default entries, which every tenant's recall carries. Operator keys."""
    return {"entries": [e.as_json() for e in await s.tenant.platform(p)]}


@router.put("/v1/platform/entries/{entry_id}")
async def set_platform(entry_id: IdPath, body: PlatformRequest, p: Caller, s: Svc, wait: bool = True):
    """Sets (or replaces) a platform entry: the deployment's own operator key only; at most 20 of
    each kind, 500 characters each."""
    return await s.tenant.set_platform(p, entry_id, body.kind, body.text, wait)


@router.delete("/v1/platform/entries/{entry_id}")
async def remove_platform(entry_id: IdPath, p: Caller, s: Svc, wait: bool = True):
    return await s.tenant.remove_platform(p, entry_id, wait)
