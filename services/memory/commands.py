"""Command submission: the memory writes an agent, a member or an operator asks for, checked,
then sent to the ledger.

A write is refused here when the key may not make it, memory is off, the tool is not offered, the
subject may not have memory now (consent, channel, removal: `events.rules.subjects`), the write
filter refuses the text, or the command is over its size limit; otherwise it goes to the commands
log through a `CommandPublisher`, and with `wait` its outcome is awaited and read back. Every
command carries the member it speaks for (`user`); the ledger checks it again, last.

Who sends what: an agent key the tool writes its configuration offers; a member key edits and
deletes its own user-scope facts and grants or withdraws its consent; an operator key edits,
deletes, configures, withdraws a member's consent, erases a subject and removes an agent or a
member, and never writes a member's memory (no write naming X-User or asking user scope); only
the deployment's own operator key removes a tenant. No answer carries a record its caller could
not read (`readable_by`, the reads' rule).

The subject writes (consent, erasure, removals) are in `subject_writes`, and sending and
read-your-writes in `submission`; `MemoryCommands` answers for all of them.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from events.base import utcnow
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
from events.record import Provenance, Source
from events.rules import subjects, write_filter
from events.rules.visibility import default_scope
from services.errors import ApiError
from services.memory.context import Context
from services.memory.ports import CommandPublisher
from services.memory.rules import (
    check_kind_named,
    check_operator_write,
    check_role,
    check_tool,
    default_kind,
    readable_by,
    refused,
)
from services.memory.subject_writes import SubjectWrites
from services.memory.submission import CommandSubmission, encoded
from settings import Settings

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords
    from services.memory.merge import MergeCheck
    from workers.followers.memory_shards import MemoryShards

# What other modules import from here, from before submission had a module of its own.
__all__ = ["MemoryCommands", "encoded"]


class MemoryCommands:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None,
                 publisher: CommandPublisher) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory  # the shards whose projection answers `wait`; swapped with the generation
        self.publisher = publisher
        # Each reads what it needs through this object, so swapped shards reach it.
        self._sending = CommandSubmission(self)
        self._subjects = SubjectWrites(self, self._sending)

    # The near-duplicate check of direct writes (services.memory.merge), set by the memory service.
    merge: MergeCheck | None = None

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.records.config(tenant, agent) or AgentConfig()

    def _provenance(self, ctx: Context, source_ref: str | None = None) -> Provenance:
        role = ctx.principal.role
        return Provenance(
            source_ref=source_ref,
            source={"operator": Source.OPERATOR, "member": Source.MEMBER}.get(role, Source.TOOL),
            execution_id=ctx.execution_id,
            invocation=ctx.invocation,
            agent_version=ctx.agent_version,
            session=ctx.session,
            user=ctx.user,
            turn=ctx.turn,
            modified_by=f"member:{ctx.user}" if role == "member" else f"{role}:{ctx.principal.agent or ctx.tenant}",
        )

    async def _check_tool(self, ctx: Context, tool: str) -> AgentConfig:
        """The key may make this tool write (an operator's names no member), and, for an agent's,
        its subject may have memory now."""
        check_operator_write(ctx)
        cfg = await self.config(ctx.tenant, ctx.agent)
        check_tool(ctx, cfg, tool, self.settings.memory_kill_switch)
        if ctx.principal.role != "operator":
            await self.check_subject(ctx, cfg)
        return cfg

    async def check_subject(self, ctx: Context, cfg: AgentConfig | None = None) -> None:
        """The one subject rule (consent, channel, removal) before an agent's call: 403 with its code."""
        cfg = cfg or await self.config(ctx.tenant, ctx.agent)
        state = await self.records.subject(ctx.tenant, ctx.agent, ctx.user)
        refused(subjects.refusal(cfg, ctx.user, ctx.channel, state))

    async def _check_record(self, ctx: Context, rid: str) -> None:
        """A record the key may not read it may not address: refused here, as the ledger refuses
        it (the same NOT_FOUND whether or not it exists), by the reads' one rule (`readable_by`):
        a member's user-scope facts are theirs alone, never an operator's or another member's,
        and a member key addresses nothing else. What the view does not hold yet, the ledger answers."""
        r = await self.records.get(ctx.tenant, ctx.agent, rid)
        if r is not None and not readable_by(ctx, r):
            raise ApiError(ErrorCode.NOT_FOUND, "record_id", f"record {rid} does not exist for this agent", 404)

    def _screen(self, ctx: Context, **fields: Any) -> None:
        """The write-time filter on an agent's own write, as on a model's: only an operator's
        write bypasses it. The refusal names the field and the rule, never the text."""
        if self._provenance(ctx).source is Source.OPERATOR:
            return
        if hit := write_filter.check_write(**fields):
            raise ApiError(ErrorCode.WRITE_REFUSED, hit.field, hit.message(), 422)

    def _command(self, cls: type, ctx: Context, **fields: Any) -> Any:
        """A command spoken for `ctx`: its agent, its member, its turn, its provenance."""
        user = fields.pop("user", ctx.user)
        return cls(
            command_id=fields.pop("command_id", None) or str(uuid.uuid4()),
            tenant=ctx.tenant,
            agent=ctx.agent,
            issued_at=utcnow(),
            provenance=self._provenance(ctx),
            turn_ref=ctx.turn_ref,
            preview=ctx.preview,
            user=user,
            **fields,
        )

    async def add(self, ctx: Context, wait: bool = True, **fields: Any) -> dict[str, Any]:
        """A write that names no kind is of the agent's default kind (`default_kind`)."""
        cfg = await self._check_tool(ctx, "add_memory")
        if cfg.memory.kinds_required:
            check_kind_named(cfg, fields.get("kind"))
        elif not fields.get("kind"):
            fields["kind"] = default_kind(cfg)
        layer = fields.pop("layer", None)
        source_ref = fields.pop("source_ref", None)
        if layer == "Session" and (not fields.get("run") or fields.get("scope")):
            field = "scope" if fields.get("run") else "run_id"
            raise ApiError(ErrorCode.VALIDATION_FAILED, field, "layer Session keeps the write in the run's session "
                           "memory only: name the run (run_id) and no scope, or use layer Workspace")
        cmd = self._command(AddMemory, ctx, session=ctx.session, **fields)  # validated, so within its limits
        if source_ref is not None:
            cmd = cmd.model_copy(update={"provenance": self._provenance(ctx, source_ref)})
        if layer == "Workspace" and cmd.run and cmd.scope is None:
            # Stored durably at once, in the scope the agent's writes take, and recorded in the run too.
            cmd = cmd.model_copy(update={"scope": default_scope(cfg.memory.scope.write, cmd.session, cmd.user)})
        check_operator_write(ctx, cmd.scope)
        self._screen(ctx, summary=cmd.summary, content=cmd.content, kind=cmd.kind, labels=cmd.labels,
                     metadata=cmd.metadata, key=cmd.key, tags=" ".join(cmd.tags), classification=cmd.classification,
                     source_ref=cmd.provenance.source_ref)
        if self.merge is not None and (ev := await self.merge.evidence(cmd, cfg, self.memory)) is not None:
            cmd = cmd.model_copy(update={"merge": ev})  # a near duplicate: the ledger merges it if it agrees
        return await self.submit(cmd, wait, ctx=ctx)

    async def curate(self, ctx: Context, label: str, action: str, line: str | None, old: str | None,
                     scope: str = "agent", wait: bool = True, application: str | None = None) -> dict[str, Any]:
        if scope == "workspace":
            if ctx.principal.role != "operator":
                raise ApiError(ErrorCode.FORBIDDEN, "scope", "only an operator key curates workspace-wide blocks", 403)
            ctx = dataclasses.replace(ctx, agent=WORKSPACE)
        await self._check_tool(ctx, "curate_block")
        cmd = self._command(CurateBlock, ctx, label=label, action=action, line=line, old=old, application=application)
        self._screen(ctx, label=cmd.label, line=cmd.line)
        return await self.submit(cmd, wait, ctx=ctx)

    async def report(self, ctx: Context, rid: str, success: bool, wait: bool = True,
                     expected_version: int | None = None) -> dict[str, Any]:
        """An outcome of applying a procedure, counted on it."""
        await self._check_tool(ctx, "report_outcome")
        await self._check_record(ctx, rid)
        return await self.submit(self._command(ReportOutcome, ctx, record_id=rid, success=success, session=ctx.session,
                                               expected_version=expected_version), wait, ctx=ctx)

    async def delete(self, ctx: Context, rid: str, wait: bool = True,
                     expected_version: int | None = None) -> dict[str, Any]:
        """An agent's `delete_memory`, an operator's deletion, or a member deleting their own fact
        (with or without consent; the tombstone stays)."""
        if ctx.principal.role != "member":
            await self._check_tool(ctx, "delete_memory")
        await self._check_record(ctx, rid)
        return await self.submit(self._command(DeleteMemory, ctx, record_id=rid, session=ctx.session,
                                               expected_version=expected_version), wait, ctx=ctx)

    async def edit(self, ctx: Context, rid: str, wait: bool = True, **fields: Any) -> dict[str, Any]:
        """An operator's edit, or a member's of their own fact: both bypass the write filter; the
        same text changes nothing, new text makes a successor (for a member, only while consent
        is granted: the ledger checks)."""
        check_role(ctx, ("operator", "member"), "edit a record; an agent replaces one (add_memory with replaces)")
        check_operator_write(ctx)
        await self._check_record(ctx, rid)
        return await self.submit(self._command(EditMemory, ctx, record_id=rid, **fields), wait, ctx=ctx)

    async def pin(self, ctx: Context, rid: str, pinned: bool, wait: bool = True,
                  expected_version: int | None = None) -> dict[str, Any]:
        await self._check_tool(ctx, "pin_memory" if pinned else "unpin_memory")
        await self._check_record(ctx, rid)
        return await self.submit(self._command(PinMemory if pinned else UnpinMemory, ctx, record_id=rid,
                                               session=ctx.session, expected_version=expected_version), wait, ctx=ctx)

    async def configure(self, ctx: Context, config: AgentConfig, wait: bool = True) -> dict[str, Any]:
        check_role(ctx, ("operator",), "change an agent's configuration")

        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            # Answered once the record view serves it: every read (search, history, recall)
            # takes the agent's configuration from there.
            async def shown() -> bool:
                return await self.records.config(cmd.tenant, cmd.agent) == cmd.config

            self._rejected(events)
            await self._sending.applied(cmd, shown, "the configuration")
            return await self._outcome(cmd, events, ctx)

        return await self.submit(self._command(ConfigureAgent, ctx, config=config), wait, outcome)

    # ------------------------------------------------------------------ subjects (`SubjectWrites`)

    async def grant_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.grant_consent(ctx, wait)

    async def withdraw_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.withdraw_consent(ctx, wait)

    async def erase_subject(self, ctx: Context, user: str, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.erase_subject(ctx, user, wait)

    async def remove_agent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.remove_agent(ctx, wait)

    async def remove_user(self, ctx: Context, user: str, wait: bool = True, erase: bool = True) -> dict[str, Any]:
        return await self._subjects.remove_user(ctx, user, wait, erase)

    async def check_not_removed(self, tenant: str, agent: str | None, user: str | None) -> None:
        await self._subjects.check_not_removed(tenant, agent, user)

    async def restore_user(self, ctx: Context, user: str, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.restore_user(ctx, user, wait)

    async def restore_tenant(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.restore_tenant(ctx, wait)

    async def remove_tenant(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        return await self._subjects.remove_tenant(ctx, wait)

    # ------------------------------------------------------------------ submission (`CommandSubmission`)

    # How long an answer waits for the record view to show what the ledger applied.
    READ_YOUR_WRITES_S = 6.0

    async def submit(self, cmd: Any, wait: bool, outcome: Any = None, ctx: Context | None = None) -> dict[str, Any]:
        """Sends `cmd`; with `wait`, answers its outcome: `outcome`'s, or the records it wrote
        that `ctx` may read (none without a `ctx`)."""
        return await self._sending.submit(cmd, wait, outcome, ctx)

    async def _outcome(self, cmd: Any, events: list[Any], ctx: Context | None) -> dict[str, Any]:
        return await self._sending.written(cmd, events, ctx)

    def _rejected(self, events: list[Any]) -> None:
        self._sending.rejected(events)

    async def _until(self, cmd: Any, shown: Any, what: str) -> None:
        await self._sending.until(cmd, shown, what)
