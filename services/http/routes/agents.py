"""A tenant's agents and an agent's overview, for operators (counts, never a member's fact)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header

from services.http.deps import Caller, Ctx, Svc, tenant_of
from services.memory import overview
from services.memory.rules import check_role

router = APIRouter(tags=["agents"])


@router.get("/v1/agents")
async def list_agents(p: Caller, s: Svc, x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """The tenant's configured agents with their configuration (operator keys; the bootstrap
    key names the tenant with X-Tenant)."""
    check_role(p, ("operator",), "list a tenant's agents")
    return {"agents": await overview.agents(s, tenant_of(p, x_tenant))}


@router.get("/v1/agent/overview")
async def agent_overview(ctx: Ctx, s: Svc) -> dict[str, Any]:
    """The agent X-Agent names: record counts by status, kind and scope, its blocks (label and
    size), live episodes and procedures, and its members' fact counts and consent (operator keys)."""
    return await overview.overview(s, ctx)
