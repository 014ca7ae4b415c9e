"""Command submission: the memory writes an agent or operator asks for, checked, then sent to the ledger.

A write is refused here when the key may not make it, memory is off, the tool is not offered, the
write filter refuses the text, or the command is over its size limit; otherwise it goes to the
commands log through a `CommandPublisher`, and with `wait` its outcome is awaited and read back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticSerializationError, to_json

from events.base import utcnow
from events.codec import encode
from events.commands import (
    WORKSPACE,
    AddMemory,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    PinMemory,
    ReportOutcome,
    UnpinMemory,
)
from events.config import AgentConfig
from events.errors import ErrorCode
from events.limits import COMMAND_LIMIT, largest_field, too_large
from events.record import Provenance, Source
from events.rules import write_filter
from projections.applied_waiter import Key, block_key, record_key
from services.errors import ApiError
from services.memory.context import Context
from services.memory.ports import CommandPublisher
from services.memory.rules import check_tool
from settings import Settings

if TYPE_CHECKING:
    from projections.redis_records import RedisRecords
    from workers.memory_shards import MemoryShards


class MemoryCommands:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None,
                 publisher: CommandPublisher) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory  # the shards whose projection answers `wait`; swapped with the generation
        self.publisher = publisher

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.records.config(tenant, agent) or AgentConfig()

    def _provenance(self, ctx: Context) -> Provenance:
        return Provenance(
            source=Source.OPERATOR if ctx.principal.role == "operator" else Source.TOOL,
            execution_id=ctx.execution_id,
            session=ctx.session,
            turn=ctx.turn,
            modified_by=f"{ctx.principal.role}:{ctx.principal.agent or ctx.tenant}",
        )

    async def _check_tool(self, ctx: Context, tool: str) -> AgentConfig:
        cfg = await self.config(ctx.tenant, ctx.agent)
        check_tool(ctx, cfg, tool, self.settings.memory_kill_switch)
        return cfg

    def _screen(self, ctx: Context, **fields: Any) -> None:
        """The write-time filter on an agent's own write, as on a model's: only an operator's
        write bypasses it. The refusal names the field and the rule, never the text."""
        if self._provenance(ctx).source is Source.OPERATOR:
            return
        if hit := write_filter.check_write(**fields):
            raise ApiError(ErrorCode.WRITE_REFUSED, hit.field, hit.message(), 422)

    def _command(self, cls: type, ctx: Context, **fields: Any) -> Any:
        """A command spoken for `ctx`: its agent, its turn, its provenance."""
        return cls(
            command_id=fields.pop("command_id", None) or str(uuid.uuid4()),
            tenant=ctx.tenant,
            agent=ctx.agent,
            issued_at=utcnow(),
            provenance=self._provenance(ctx),
            turn_ref=ctx.turn_ref,
            preview=ctx.preview,
            **fields,
        )

    async def add(self, ctx: Context, wait: bool = True, **fields: Any) -> dict[str, Any]:
        await self._check_tool(ctx, "add_memory")
        cmd = self._command(AddMemory, ctx, session=ctx.session, **fields)  # validated, so within its limits
        self._screen(ctx, summary=cmd.summary, content=cmd.content, kind=cmd.kind, labels=cmd.labels,
                     metadata=cmd.metadata)
        return await self.submit(cmd, wait)

    async def curate(self, ctx: Context, label: str, action: str, line: str | None, old: str | None,
                     scope: str = "agent", wait: bool = True) -> dict[str, Any]:
        if scope == "workspace":
            if ctx.principal.role != "operator":
                raise ApiError(ErrorCode.FORBIDDEN, "scope", "only an operator key curates workspace-wide blocks", 403)
            ctx = dataclasses.replace(ctx, agent=WORKSPACE)
        await self._check_tool(ctx, "curate_block")
        cmd = self._command(CurateBlock, ctx, label=label, action=action, line=line, old=old)
        self._screen(ctx, label=cmd.label, line=cmd.line)
        return await self.submit(cmd, wait)

    async def report(self, ctx: Context, rid: str, success: bool, wait: bool = True) -> dict[str, Any]:
        """An outcome of applying a procedure, counted on it."""
        await self._check_tool(ctx, "report_outcome")
        return await self.submit(self._command(ReportOutcome, ctx, record_id=rid, success=success, session=ctx.session),
                                 wait)

    async def delete(self, ctx: Context, rid: str, wait: bool = True) -> dict[str, Any]:
        await self._check_tool(ctx, "delete_memory")
        return await self.submit(self._command(DeleteMemory, ctx, record_id=rid, session=ctx.session), wait)

    async def edit(self, ctx: Context, rid: str, wait: bool = True, **fields: Any) -> dict[str, Any]:
        if ctx.principal.role != "operator":
            raise ApiError(ErrorCode.FORBIDDEN, None, "only an operator key can edit a record; agents replace them", 403)
        return await self.submit(self._command(EditMemory, ctx, record_id=rid, **fields), wait)

    async def pin(self, ctx: Context, rid: str, pinned: bool, wait: bool = True) -> dict[str, Any]:
        await self._check_tool(ctx, "pin_memory" if pinned else "unpin_memory")
        return await self.submit(self._command(PinMemory if pinned else UnpinMemory, ctx, record_id=rid,
                                               session=ctx.session), wait)

    async def configure(self, ctx: Context, config: AgentConfig, wait: bool = True) -> dict[str, Any]:
        if ctx.principal.role != "operator":
            raise ApiError(ErrorCode.FORBIDDEN, None, "only an operator key can change an agent's configuration", 403)
        return await self.submit(self._command(ConfigureAgent, ctx, config=config), wait)

    async def submit(self, cmd: Any, wait: bool) -> dict[str, Any]:
        data = encoded(cmd)
        fut = self.memory.wait_for(cmd.command_id, cmd.tenant, cmd.agent) if wait else None
        try:
            await self.publisher.send(cmd, data)
        except BaseException:
            if fut is not None:
                fut.cancel()  # nobody waits for a command that was never sent
            raise
        if fut is None:
            return {"command_id": cmd.command_id, "status": "accepted"}
        try:
            events = await asyncio.wait_for(fut, timeout=30)
        except TimeoutError:
            raise ApiError(
                ErrorCode.TIMEOUT, None,
                f"command {cmd.command_id} was accepted but not applied within 30 s; check the workers"
            ) from None
        return await self._outcome(cmd, events)

    async def _outcome(self, cmd: Any, events: list[Any]) -> dict[str, Any]:
        for e in events:
            if e.type == "CommandRejected":
                raise ApiError(e.code, e.field, e.reason)
        result: dict[str, Any] = {"command_id": cmd.command_id, "status": "applied", "memories": []}
        for e in events:
            if e.type == "WriteStaged":
                result["status"] = "pending_turn"
            elif e.type == "WriteDiscarded":
                result["status"] = "discarded"
                result["reason"] = e.reason
            elif e.type == "BlockChanged":
                result["block"] = {"label": e.label, "text": e.text}
            elif hasattr(e, "record"):
                result["memories"].append(e.record.model_dump(mode="json"))
                if getattr(e, "merged", False):
                    result["merged"] = True
                    result["id"] = e.record.id
                elif e.type in ("RecordAdded", "RecordDeleted", "RecordPinned", "RecordUnpinned", "RecordRevised"):
                    result.setdefault("id", e.record.id)
        # Read-your-writes: the Redis projection is a separate process; wait for it too, and
        # never answer "applied" for what a read right after would not show.
        if block := result.get("block"):

            async def block_shown() -> bool:
                return (await self.records.blocks(cmd.tenant, cmd.agent)).get(block["label"], "") == block["text"]

            await self._seen(cmd, block_key(cmd.tenant, cmd.agent, block["label"]), 0, block_shown,
                             f"block {block['label']}'s new text")
        if "id" in result:
            rid = result["id"]
            want = max(m["version"] for m in result["memories"] if m["id"] == rid)

            async def record_shown() -> bool:
                r = await self.records.get(cmd.tenant, cmd.agent, rid)
                return bool(r and r.version >= want)

            await self._seen(cmd, record_key(cmd.tenant, cmd.agent, rid), want, record_shown,
                             f"version {want} of record {rid}")
        return result

    READ_YOUR_WRITES_S = 6.0

    async def _seen(self, cmd: Any, key: Key, version: int, shown: Any, what: str) -> None:
        """Until the record view (the redis-projection worker's) shows the change: `shown` is read
        now and each time the worker announces applying `key` at `version` or later. Raises TIMEOUT
        naming the command and what the view did not show."""
        if not await self.records.applied().wait(key, shown, self.READ_YOUR_WRITES_S, version):
            raise ApiError(
                ErrorCode.TIMEOUT, None,
                f"command {cmd.command_id} was applied by the ledger, but the record view (the redis-projection "
                f"worker) did not show {what} within {self.READ_YOUR_WRITES_S:g} s; check that worker and "
                "read again before writing again")


def encoded(cmd: Any) -> bytes:
    """The command as sent, refused before sending when it is over `COMMAND_LIMIT` (every
    event the ledger makes of it must fit the broker's message limit) or holds a string
    that is not text (a lone surrogate cannot be encoded)."""
    try:
        data = encode(cmd)
    except PydanticSerializationError:
        field = next((f for f in type(cmd).model_fields if not _serializable(getattr(cmd, f))), None)
        raise ApiError(ErrorCode.VALIDATION_FAILED, field, f"{field or 'the command'} holds a string that is not valid "
                       "Unicode text (a lone surrogate); send UTF-8 text", 422) from None
    if len(data) > COMMAND_LIMIT:
        field = largest_field(cmd)
        raise ApiError(ErrorCode.LIMIT_EXCEEDED, field, too_large("the command", len(data), COMMAND_LIMIT, field), 413)
    return data


def _serializable(value: Any) -> bool:
    try:
        to_json(value)
    except PydanticSerializationError:
        return False
    return True
