"""An agent's configuration: read it (its keys) and replace it (operator keys)."""

from __future__ import annotations

from fastapi import APIRouter

from events.config import AgentConfig
from services.http.deps import Ctx, Svc
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()


@router.put("/v1/config")
async def put_config(config: AgentConfig, ctx: Ctx, s: Svc):
    return await s.commands.configure(ctx, config)


@router.get("/v1/config")
async def get_config(ctx: Ctx, s: Svc):
    check_role(ctx, NOT_MEMBER, "read an agent's configuration")
    return (await s.config(ctx.tenant, ctx.agent)).model_dump(mode="json")
