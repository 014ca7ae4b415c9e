"""Session memory: a run's entries and summary, as recall gets them (docs/features/session-memory.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from events.base import RUN_ID_PATTERN, utcnow
from events.errors import ErrorCode
from projections.redis.run_view import RunView
from services.errors import ApiError
from services.http.deps import Ctx, Svc
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()

RunIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=RUN_ID_PATTERN,
                                description="the run: 1-128 letters, digits, '.', '_' or '-'")]


@router.get("/v1/runs/{run_id}")
async def read_run(run_id: RunIdPath, ctx: Ctx, s: Svc):
    """The calling agent's run: `sessionEntries` (oldest first), `sessionSummary`, and when
    it expires (48 hours after its last write); empty once expired or never written."""
    check_role(ctx, NOT_MEMBER, "read an agent's session memory")
    if ctx.principal.role == "operator" and ctx.user is not None:
        # A member's session memory is theirs, as their user-scope facts are: never an operator's.
        raise ApiError(ErrorCode.FORBIDDEN, "x-user", "an operator key never reads a member's session memory", 403)
    if ctx.principal.role != "operator":  # the subject rule every agent's call is held to (consent, removal)
        await s.commands.check_subject(ctx)
    return (await RunView(s.records).read(ctx.tenant, ctx.agent, run_id, utcnow(), ctx.user)).as_json()
