"""Listing and reading memory: a page of the agent's records, one record and its history, each
only as its caller may read it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from events.errors import ErrorCode
from events.record import MemoryRecord
from events.rules.visibility import visible
from projections.records import Page
from services.errors import ApiError
from services.memory import member_reads
from services.memory.context import Context
from services.memory.rules import readable_by

if TYPE_CHECKING:
    from events.config import AgentConfig
    from projections.redis.record_view import RedisRecords


class ListingReads(Protocol):
    """What listing reads of the memory reads: the record view and the checks every read makes."""

    records: RedisRecords

    async def config(self, tenant: str, agent: str) -> AgentConfig: ...

    def _check_enabled(self, ctx: Context, cfg: AgentConfig) -> None: ...

    async def _check_subject(self, ctx: Context, cfg: AgentConfig) -> None: ...

    async def _shadowed(self, ctx: Context) -> set[str]: ...


class MemoryListing:
    def __init__(self, reads: ListingReads) -> None:
        self.reads = reads

    async def memories(self, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
        """A page of the agent's listed records by creation time. An operator sees every
        session's and preview records but no member's facts; a member their own live facts
        (pending and conflicting ones too), at most `member_reads.MEMBER_LIST` a page; an agent what it may read."""
        reads = self.reads
        cfg = await reads.config(ctx.tenant, ctx.agent)
        reads._check_enabled(ctx, cfg)
        await reads._check_subject(ctx, cfg)
        role = ctx.principal.role
        if role == "operator":
            return await member_reads.operator_page(reads.records, ctx, first, after, ascending)
        if role == "member":
            return await member_reads.member_page(reads.records, ctx, first, after, ascending)
        page = await reads.records.page(ctx.tenant, ctx.agent, first, after, ascending=ascending)
        hidden = await reads._shadowed(ctx)
        return Page([r for r in page.records if visible(r, ctx) and r.id not in hidden], page.next_cursor)

    async def read(self, ctx: Context, rid: str, version: int | None = None) -> MemoryRecord:
        """For an operator: any of the agent's records, whatever its session or mode, but a
        member's facts. For a member: their own facts. For an agent (`read_memory`): a
        record it may read. Whatever its status; one the caller may not read is NOT_FOUND,
        as a missing one is."""
        reads = self.reads
        cfg = await reads.config(ctx.tenant, ctx.agent)
        reads._check_enabled(ctx, cfg)
        await reads._check_subject(ctx, cfg)
        if ctx.principal.role in ("agent", "helper") and "read_memory" not in cfg.memory.tools:
            raise ApiError(ErrorCode.TOOL_NOT_ALLOWED, "tool", f"read_memory is not in memory.tools "
                           f"{cfg.memory.tools}; search_memory with ids reads current records")
        r = await reads.records.get(ctx.tenant, ctx.agent, rid, version)
        if r is None or not readable_by(ctx, r):
            raise ApiError(ErrorCode.NOT_FOUND, "id", f"no record {rid} for this agent")
        return r

    async def history(self, ctx: Context, rid: str) -> list[MemoryRecord]:
        await self.read(ctx, rid)
        return await self.reads.records.history(ctx.tenant, ctx.agent, rid)
