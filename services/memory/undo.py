"""An operator's undo of what a command, a turn or a session wrote (`events.rules.undo` plans it;
the ledger applies it, `events.rules.ledger.undo`)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from events.base import utcnow
from events.commands import UndoWrites
from events.errors import ErrorCode
from events.record import Provenance, Source
from events.rules import undo
from services.errors import ApiError
from services.memory.commands import MemoryCommands
from services.memory.context import Context
from services.memory.rules import check_role, members_data

Target = Literal["command", "turn", "session"]


class MemoryUndo:
    def __init__(self, commands: MemoryCommands) -> None:
        self.commands = commands

    async def undo(self, ctx: Context, target: Target, ref: str, force: bool = False,
                   preview: bool = False) -> dict[str, Any]:
        """The plan, and unless `preview` its outcome. Later writes of others to what it takes back
        stop it (409 naming `force`) unless `force`: then they are taken back too."""
        check_role(ctx, ("operator",), "undo writes")
        try:
            made_by = undo.matcher(target, ref)
        except ValueError as e:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "ref", str(e), 422) from None
        held = await self.commands.records.every_version(ctx.tenant, ctx.agent)
        # A member's data is theirs: an operator's undo neither shows nor changes a record naming a
        # member (they delete their own facts), and says how many it left.
        theirs = {rid for rid, versions in held.items() if any(members_data(ctx, r) for _, r in versions)}
        p = undo.plan(([undo.Version(c, r) for c, r in versions] for rid, versions in held.items()
                       if rid not in theirs), made_by)
        left = undo.plan(([undo.Version(c, r) for c, r in held[rid]] for rid in theirs), made_by).touched
        if not p.touched and not left:
            raise ApiError(ErrorCode.NOT_FOUND, "ref", f"nothing of this agent was written by {target} {ref}", 404)
        out: dict[str, Any] = {"target": target, "ref": ref, "touched": p.touched, "unchanged": p.unchanged,
                               "members_records_left": left,
                               "changes": [c.model_dump(mode="json") for c in p.changes],
                               "dependents": [str(d) for d in p.dependents]}
        if preview or not p.changes:
            return {**out, "status": "preview" if preview else "nothing_to_undo"}
        if p.dependents and not force:
            shown = "; ".join(str(d) for d in p.dependents[:10]) + (" ..." if len(p.dependents) > 10 else "")
            raise ApiError(ErrorCode.VERSION_CONFLICT, "force", f"later writes depend on what this undo takes back: "
                           f"{shown}; undo them first, or pass force=true to take them back too", 409)
        cmd = UndoWrites(command_id=f"undo-{uuid.uuid4().hex}", tenant=ctx.tenant, agent=ctx.agent,
                         issued_at=utcnow(), target=target, ref=ref, changes=p.changes,
                         provenance=Provenance(source=Source.OPERATOR, modified_by="undo"))
        answer = await self.commands.submit(cmd, wait=True, ctx=ctx)
        return {**out, "undo_command_id": cmd.command_id, "status": answer.get("status")}
