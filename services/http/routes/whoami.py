"""Whoami: the key's tenant, agent and role."""

from __future__ import annotations

from fastapi import APIRouter

from services.http.deps import Caller
from services.http.responses import WhoAmI

router = APIRouter()


@router.get("/v1/whoami", response_model=WhoAmI)
async def whoami(p: Caller):
    """The key's tenant, agent, role and, for a member key, its member (what an MCP server offers depends on it)."""
    return {"tenant": p.tenant, "agent": p.agent, "role": p.role, "key_id": p.key_id, "user": p.user}
