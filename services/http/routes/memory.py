"""Memory records: write (add, edit, delete, pin, report an outcome) and read (list, one, its history).

A member key lists, reads and reads the history of its own user-scope facts, and edits and
deletes them; it never adds, pins or reports an outcome (those are the agent's tools).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

# Metadata and labels use the command's own checked types, so a body too deep or too large
# for a command is refused where it is parsed, with the limit.
from events.base import RunId
from events.commands import Labels, Metadata
from events.errors import ErrorCode
from events.record import Scope
from services.errors import ApiError
from services.http.deps import Ctx, Svc
from services.http.models import Body
from services.http.responses import record_out
from services.memory.past import holds_at

router = APIRouter()


class AddRequest(Body):
    summary: str
    content: str = ""
    kind: str | None = None  # left out: "fact" where the agent declares it, else its first declared kind
    labels: Labels = {}
    tags: list[str] = []  # free-form, filterable: at most 20, each 1-64 characters without "="
    classification: str | None = None  # the writer's, say "internal" or "confidential"
    source_ref: str | None = None  # where the writer found it (a URL, a document or ticket id), kept in provenance
    scope: Scope | None = None
    pinned: bool = False
    replaces: str | None = None
    key: str | None = None
    confidence: float | None = None
    importance: float | None = None  # 0..1, the writer's; left out: 0.5 (docs/features/trust.md)
    # With replaces: the version of the replaced record read; without, only 0 (must create).
    expected_version: int | None = None
    expires_at: datetime | None = None  # at most 180 days ahead; later dates are clamped
    # World time (kept on every version): when it was observed, and from when until when it
    # held; valid_from at most valid_to.
    observed_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    metadata: Metadata = {}
    command_id: str | None = None
    # The run (session memory) this write belongs to: without a scope it is a run entry only
    # (docs/features/session-memory.md). Checked here, so a bad id is refused naming `run_id`.
    run_id: RunId | None = None
    # With run_id: "Session" keeps the write in the run's session memory only, "Workspace" also
    # stores it durably at once (as a scope does). Left out: durable only when a scope is named.
    layer: Literal["Session", "Workspace"] | None = None


class OutcomeRequest(Body):
    success: bool
    expected_version: int | None = None  # the version read: refused (409) if the record moved on


class EditRequest(Body):
    summary: str | None = None
    content: str | None = None
    metadata: Metadata | None = None
    expected_version: int | None = None  # the version read: refused (409) if the record moved on


# The version a write read of its record (docs/features/trust.md), for the calls that take no body.
ExpectedVersion = Annotated[int | None, Query(ge=1, description="the version read; refused (409) if the record moved on")]


@router.post("/v1/memory/{rid}/outcome")
async def report_outcome(rid: str, body: OutcomeRequest, ctx: Ctx, s: Svc, wait: bool = True):
    """The outcome of applying a procedure; its validations and successes or failures
    count up. An agent needs `report_outcome` in memory.tools."""
    return await s.commands.report(ctx, rid, body.success, wait=wait, expected_version=body.expected_version)


@router.post("/v1/memory", status_code=201)
async def add_memory(body: AddRequest, ctx: Ctx, s: Svc, wait: bool = True):
    fields = body.model_dump(exclude_none=True)
    if "run_id" in fields:
        fields["run"] = fields.pop("run_id")
    return await s.commands.add(ctx, wait=wait, **fields)


# Memory as it stood at a past point (docs/features/time-travel.md).
AsOf = Annotated[str | None, Query(max_length=40, description="memory as it stood then: a time with its UTC offset "
                                   "(2026-03-01T12:00:00Z), or a log position of the agent's event partition")]


@router.get("/v1/memory")
async def list_memory(
    ctx: Ctx,
    s: Svc,
    first: Annotated[int, Query(ge=1, le=200)] = 20,
    after: str | None = None,
    sort: Literal["DESC", "ASC"] = "DESC",
    as_of: AsOf = None,
    valid_at: Annotated[datetime | None, Query(description="only the facts that held in the world then: "
                                               "valid_from at or before it, valid_to after it (unset: open)")] = None,
):
    page = await (await s.reads_at(ctx, as_of)).memories(ctx, first, after, ascending=sort == "ASC")
    records = page.records if valid_at is None else [r for r in page.records if holds_at(r, valid_at)]
    return {"records": [record_out(r) for r in records], "next_cursor": page.next_cursor}


@router.get("/v1/memory/{rid}")
async def read_memory(rid: str, ctx: Ctx, s: Svc, version: Annotated[int | None, Query(ge=1)] = None,
                      as_of: AsOf = None):
    return record_out(await (await s.reads_at(ctx, as_of)).read(ctx, rid, version))


@router.get("/v1/memory/{rid}/history")
async def memory_history(rid: str, ctx: Ctx, s: Svc, first: Annotated[int, Query(ge=1, le=100)] = 20,
                         after: Annotated[str | None, Query(max_length=20)] = None, as_of: AsOf = None):
    """A record's versions, newest first, a page of `first` at a time; `after`: the page's
    `next_cursor` (the last version it showed)."""
    below = None
    if after is not None:
        if not after.isdigit() or not 1 <= int(after) <= 2**31:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "after", "after: pass the next_cursor of the page before", 422)
        below = int(after)
    reads = await s.reads_at(ctx, as_of)
    versions = [r for r in await reads.history(ctx, rid) if below is None or r.version < below]
    page = versions[:first]
    more = len(versions) > first
    return {"versions": [record_out(r) for r in page], "next_cursor": str(page[-1].version) if more else None}


@router.get("/v1/memory/{rid}/recalls")
async def memory_recalls(rid: str, ctx: Ctx, s: Svc, request: Request):
    """Whether the record was ever recalled into a conversation (any version): `count`, and the
    `first` and `last` times, from the activity view of `memlane.usage`. Whoever may read the
    record may ask."""
    await s.reads.read(ctx, rid)
    return (await request.app.state.activity.recalls_of(ctx.tenant, ctx.agent, [rid]))[rid]


@router.delete("/v1/memory/{rid}")
async def delete_memory(rid: str, ctx: Ctx, s: Svc, wait: bool = True, expected_version: ExpectedVersion = None):
    return await s.commands.delete(ctx, rid, wait=wait, expected_version=expected_version)


@router.patch("/v1/memory/{rid}")
async def edit_memory(rid: str, body: EditRequest, ctx: Ctx, s: Svc, wait: bool = True):
    """Operator or member edit (a member: their own user-scope facts): new text makes a
    successor; the same text changes nothing. Neither passes the write filter."""
    return await s.commands.edit(ctx, rid, wait=wait, **body.model_dump(exclude_none=True))


@router.post("/v1/memory/{rid}/pin")
async def pin_memory(rid: str, ctx: Ctx, s: Svc, expected_version: ExpectedVersion = None):
    return await s.commands.pin(ctx, rid, True, expected_version=expected_version)


@router.delete("/v1/memory/{rid}/pin")
async def unpin_memory(rid: str, ctx: Ctx, s: Svc, expected_version: ExpectedVersion = None):
    return await s.commands.pin(ctx, rid, False, expected_version=expected_version)
