"""`GET /v1/export`: what the caller may read of an agent, as a portable file (JSON lines,
`events.rules.portable`): every record with its versions, then blocks, the member's profile and
notes. A member's own export needs the agent's `memory.member_export`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from events.base import utcnow
from events.errors import ErrorCode
from events.rules import portable
from services.errors import ApiError
from services.http.deps import Ctx, Svc
from services.http.responses import record_out
from services.http.routes.blocks import block_out
from services.memory.context import Context
from services.memory.service import MemoryService

router = APIRouter()
PAGE = 200


async def _others(s: MemoryService, ctx: Context) -> list[dict[str, Any]]:
    """Blocks, the member's profile and notes: each only for the keys that may read it (blocks
    are not a member's, a profile is never an operator's, notes are only their writer's)."""
    out: list[dict[str, Any]] = []
    role = ctx.principal.role
    if role != "member":
        out += [{"type": "block", **block_out(*b)} for b in await s.reads.blocks(ctx)]
    if ctx.user is not None and role != "operator":
        try:
            out.append({"type": "profile", **await s.profiles.read(ctx, ctx.user)})
        except ApiError as e:
            if e.status != 404:
                raise
    if role not in ("member", "operator") and (await s.config(ctx.tenant, ctx.agent)).history is not None:
        cursor = None
        while True:  # notes cite history: an agent without it has none
            got = await s.notes.search(ctx, None, 100, cursor)
            out += [{"type": "note", **n} for n in got["notes"]]
            if not (cursor := got.get("next_cursor")):
                break
    return out


async def _lines(s: MemoryService, ctx: Context) -> AsyncIterator[dict[str, Any]]:
    # What may refuse is read before the header, so a refusal is an error answer, not a cut stream.
    page = await s.reads.memories(ctx, PAGE, None, ascending=True)
    others = await _others(s, ctx)
    yield portable.header(ctx.tenant, ctx.agent, ctx.user, utcnow().isoformat())
    records = 0
    while True:
        for r in page.records:
            try:
                versions = await s.reads.history(ctx, r.id)  # newest first
            except ApiError as e:
                if e.status == 404:
                    continue  # purged or erased since the page was read: not there to export
                raise
            records += 1
            yield {"type": "record", "id": r.id, "versions": [record_out(v) for v in reversed(versions)]}
        if not page.next_cursor:
            break
        page = await s.reads.memories(ctx, PAGE, page.next_cursor, ascending=True)
    for line in others:
        yield line
    yield portable.trailer(records, len(others))


@router.get("/v1/export")
async def export(ctx: Ctx, s: Svc) -> StreamingResponse:
    """The caller's readable memory of the agent as JSON lines (`application/x-ndjson`): a header,
    then each record with every version (oldest first), each block, the member's profile and
    notes. `memlane import` loads such a file into another agent or deployment."""
    if ctx.principal.role == "member":
        cfg = await s.config(ctx.tenant, ctx.agent)
        if not cfg.memory.member_export:
            raise ApiError(ErrorCode.FORBIDDEN, "memory.member_export", "this agent offers members no export of "
                           "their memory (memory.member_export is false); ask its operator", 403)
    lines = _lines(s, ctx)
    first = await anext(lines)  # a refusal (a disabled agent, no consent) is an error, not a 200

    async def body() -> AsyncIterator[bytes]:
        yield (json.dumps(first) + "\n").encode()
        async for line in lines:
            yield (json.dumps(line, ensure_ascii=False) + "\n").encode()

    return StreamingResponse(body(), media_type="application/x-ndjson")
