"""Memory blocks: labeled texts at the top of every recall."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import Field

from events.base import RUN_ID_PATTERN
from services.http.deps import Ctx, Svc
from services.http.models import Body
from services.http.responses import BlocksOut
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()


class CurateRequest(Body):
    action: Literal["add", "replace", "remove"]
    line: str | None = Field(None, description="add, replace: the line to write (one line, at most 2,000 characters)")
    old: str | None = Field(None, description="replace, remove: the line to change, as the block holds it now")


# An application (blocks may be scoped to one): named as a run is, 1-128 letters, digits, ".", "_" or "-".
Application = Annotated[str | None, Query(min_length=1, max_length=128, pattern=RUN_ID_PATTERN,
                                          description="an application: its blocks beside the agent's and "
                                                      "workspace's (1-128 letters, digits, '.', '_' or '-')")]


def block_out(scope: str, label: str, text: str, application: str | None) -> dict[str, str]:
    """A block as the API shows it: `application` only on an application's block."""
    return {"scope": scope, "label": label, "text": text, **({"application": application} if application else {})}


@router.get("/v1/blocks", response_model=BlocksOut, response_model_exclude_none=True)
async def list_blocks(ctx: Ctx, s: Svc, application: Application = None):
    """Memory blocks: labeled texts at the top of every recall, as a recall in `application`
    shows them (the workspace's, the workspace's of the application, the agent's, the agent's of
    the application); without one, no application's."""
    check_role(ctx, NOT_MEMBER, "read an agent's blocks")
    return {"blocks": [block_out(*b) for b in await s.reads.blocks(ctx, application)]}


@router.post("/v1/blocks/{label}")
async def curate_block(label: str, body: CurateRequest, ctx: Ctx, s: Svc, wait: bool = True,
                       scope: Literal["agent", "workspace"] = "agent", application: Application = None):
    """`add` a line, `replace` the line `old` with `line`, or `remove` the line `old`:
    an agent needs `curate_block` in memory.tools; a block holds at most 2,000 characters.
    `scope=workspace` (operator keys): a block every agent of the tenant recalls.
    `application`: the block is that application's, recalled only by a recall naming it."""
    check_role(ctx, NOT_MEMBER, "curate an agent's blocks")
    return await s.commands.curate(ctx, label, body.action, body.line, body.old, scope=scope, wait=wait,
                                   application=application)
