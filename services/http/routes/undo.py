"""`POST /v1/undo`: an operator takes back what a command, a turn or a session wrote."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field, model_validator

from services.http.deps import Ctx, Svc
from services.http.models import Body
from services.memory.undo import Target

router = APIRouter()


class UndoRequest(Body):
    command_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    turn: Annotated[str, Field(min_length=3, max_length=256, description="<session>/<turn number>")] | None = None
    session: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    force: bool = False  # take back later writes of others to the same records too
    preview: bool = False  # only the plan: what it would change, and what depends on it

    @model_validator(mode="after")
    def _one_target(self) -> UndoRequest:
        if sum(x is not None for x in (self.command_id, self.turn, self.session)) != 1:
            raise ValueError("name exactly one of command_id, turn or session")
        return self


@router.post("/v1/undo")
async def undo(body: UndoRequest, ctx: Ctx, s: Svc) -> dict[str, Any]:
    """Operator keys: each record the target added, replaced, pinned or deleted goes back to the
    version that stood before it (one it added is tombstoned), as an undo command on the log,
    which can itself be undone (`command_id` of the undo). A later write by another command to
    such a record stops it with 409 naming `force`; `preview` answers the plan alone."""
    named: list[tuple[Target, str | None]] = [("command", body.command_id), ("turn", body.turn),
                                              ("session", body.session)]
    target, ref = next((t, r) for t, r in named if r is not None)
    return await s.undo.undo(ctx, target, ref, force=body.force, preview=body.preview)
