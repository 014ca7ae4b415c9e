"""Memory blocks: labeled texts at the top of every recall."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import Field

from services.http.deps import Ctx, Svc
from services.http.models import Body
from services.http.responses import BlocksOut
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()


class CurateRequest(Body):
    action: Literal["add", "replace", "remove"]
    line: str | None = Field(None, description="add, replace: the line to write (one line, at most 2,000 characters)")
    old: str | None = Field(None, description="replace, remove: the line to change, as the block holds it now")


@router.get("/v1/blocks", response_model=BlocksOut)
async def list_blocks(ctx: Ctx, s: Svc):
    """Memory blocks: labeled texts at the top of every recall."""
    check_role(ctx, NOT_MEMBER, "read an agent's blocks")
    return {"blocks": [{"scope": scope, "label": label, "text": text} for scope, label, text in await s.reads.blocks(ctx)]}


@router.post("/v1/blocks/{label}")
async def curate_block(label: str, body: CurateRequest, ctx: Ctx, s: Svc, wait: bool = True,
                       scope: Literal["agent", "workspace"] = "agent"):
    """`add` a line, `replace` the line `old` with `line`, or `remove` the line `old`:
    an agent needs `curate_block` in memory.tools; a block holds at most 2,000 characters.
    `scope=workspace` (operator keys): a block every agent of the tenant recalls."""
    check_role(ctx, NOT_MEMBER, "curate an agent's blocks")
    return await s.commands.curate(ctx, label, body.action, body.line, body.old, scope=scope, wait=wait)
