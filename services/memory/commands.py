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
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, cast

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
    EraseSubject,
    GrantConsent,
    PinMemory,
    RemoveAgent,
    RemoveTenant,
    RemoveUser,
    ReportOutcome,
    RestoreTenant,
    RestoreUser,
    UnpinMemory,
    WithdrawConsent,
    block_field,
)
from events.config import AgentConfig
from events.errors import ErrorCode
from events.limits import COMMAND_LIMIT, largest_field, too_large
from events.record import Provenance, Source
from events.rules import subjects, write_filter
from events.rules.visibility import default_scope
from projections.applied_waiter import Key, command_key, record_key
from projections.redis_runs import RunView
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
from settings import Settings

if TYPE_CHECKING:
    from projections.redis_records import RedisRecords
    from services.memory.merge import MergeCheck
    from workers.followers.memory_shards import MemoryShards


class MemoryCommands:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None,
                 publisher: CommandPublisher) -> None:
        self.settings = settings
        self.records = records
        self.memory = memory  # the shards whose projection answers `wait`; swapped with the generation
        self.publisher = publisher

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
        (seed 004: with or without consent; the tombstone stays)."""
        if ctx.principal.role != "member":
            await self._check_tool(ctx, "delete_memory")
        await self._check_record(ctx, rid)
        return await self.submit(self._command(DeleteMemory, ctx, record_id=rid, session=ctx.session,
                                               expected_version=expected_version), wait, ctx=ctx)

    async def edit(self, ctx: Context, rid: str, wait: bool = True, **fields: Any) -> dict[str, Any]:
        """An operator's edit, or a member's of their own fact: both bypass the write filter
        (seed 004); the same text changes nothing, new text makes a successor (for a member,
        only while consent is granted: the ledger checks)."""
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
            await self._applied(cmd, shown, "the configuration")
            return await self._outcome(cmd, events, ctx)

        return await self.submit(self._command(ConfigureAgent, ctx, config=config), wait, outcome)

    # ------------------------------------------------------------------ subjects

    async def grant_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The member lets the agent keep and use memory about them: only the member's own key
        grants it (seed 004: granting consent is explicit)."""
        check_role(ctx, ("member",), "grant consent: the member grants it with their own key")
        await self.check_not_removed(ctx.tenant, ctx.agent, ctx.user)
        cmd = self._command(GrantConsent, ctx)
        return await self.submit(cmd, wait, self._consent_outcome("granted"))

    async def withdraw_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """Stops new writes and recall for the member at once and deletes nothing: the member's
        own key, or an operator key naming the member (X-User)."""
        check_role(ctx, ("member", "operator"), "withdraw consent: the member, or an operator naming them")
        if ctx.user is None:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-user", "x-user: name the member whose consent to "
                           "withdraw (X-User)", 422)
        cmd = self._command(WithdrawConsent, ctx)
        return await self.submit(cmd, wait, self._consent_outcome("withdrawn"))

    async def erase_subject(self, ctx: Context, user: str, wait: bool = True) -> dict[str, Any]:
        """An operator erases a member's memory on the agent: every live user-scope record of
        theirs is tombstoned and their consent withdrawn. The answer counts; it never shows a fact."""
        check_role(ctx, ("operator",), "erase a member's memory")
        cmd = self._command(EraseSubject, ctx, user=user)
        return await self.submit(cmd, wait, self._erase_outcome)

    async def remove_agent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The agent is soft-deleted: its memory is never served again, and no write is accepted."""
        check_role(ctx, ("operator",), "remove an agent")
        cmd = self._command(RemoveAgent, ctx)

        async def shown() -> bool:
            return (await self.records.subject(cmd.tenant, cmd.agent, None)).agent_removed

        return await self.submit(cmd, wait, self._state_outcome(shown, f"agent {cmd.agent} removed"))

    async def remove_user(self, ctx: Context, user: str, wait: bool = True, erase: bool = True) -> dict[str, Any]:
        """The member leaves the tenant: no agent serves their memory until they are restored
        (sent under the workspace agent, as it holds for every agent). `erase`: the user is
        deleted, and the ledger destroys their data keys on every agent; without it their facts
        are kept."""
        check_role(ctx, ("operator",), "remove a member")
        cmd = self._command(RemoveUser, dataclasses.replace(ctx, agent=WORKSPACE), user=user, erase=erase)

        async def shown() -> bool:
            return (await self.records.subject(cmd.tenant, WORKSPACE, user)).user_removed

        return await self.submit(cmd, wait, self._state_outcome(shown, f"member {user} removed"))

    async def check_not_removed(self, tenant: str, agent: str | None, user: str | None) -> None:
        """A removed tenant or member stays removed until an operator restores them: no key is
        issued to them and no consent of theirs is granted before that (403 SUBJECT_REMOVED
        naming what to restore)."""
        state = await self.records.subject(tenant, agent or WORKSPACE, user)
        if state.tenant_removed:
            raise ApiError(ErrorCode.SUBJECT_REMOVED, "tenant", f"tenant {tenant} was removed; the deployment's "
                           "operator restores it first (POST /v1/tenant/restore)", 403)
        if state.user_removed:
            raise ApiError(ErrorCode.SUBJECT_REMOVED, "user", f"member {user} was removed from the tenant; an "
                           f"operator restores them first (POST /v1/users/{user}/restore)", 403)

    async def restore_user(self, ctx: Context, user: str, wait: bool = True) -> dict[str, Any]:
        """An operator restores a removed member (under the workspace agent): keys may be issued
        to them again and they may grant consent again. Nothing erased comes back."""
        check_role(ctx, ("operator",), "restore a member")
        cmd = self._command(RestoreUser, dataclasses.replace(ctx, agent=WORKSPACE), user=user)

        async def shown() -> bool:
            return not (await self.records.subject(cmd.tenant, WORKSPACE, user)).user_removed

        return await self.submit(cmd, wait, self._state_outcome(shown, f"member {user} restored"))

    async def restore_tenant(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The deployment's operator restores a removed tenant: keys may be issued in it again.
        Nothing erased comes back."""
        self._deployment_only(ctx, "restore a tenant")
        cmd = self._command(RestoreTenant, dataclasses.replace(ctx, agent=WORKSPACE), user=None)

        async def shown() -> bool:
            return not (await self.records.subject(cmd.tenant, WORKSPACE, None)).tenant_removed

        return {**await self.submit(cmd, wait, self._state_outcome(shown, f"tenant {cmd.tenant} restored")),
                "tenant": cmd.tenant}

    @staticmethod
    def _deployment_only(ctx: Context, what: str) -> None:
        check_role(ctx, ("operator",), what)
        if not ctx.principal.deployment:
            raise ApiError(ErrorCode.FORBIDDEN, "authorization", "only the deployment's own operator key "
                           f"(MEMLANE_OPERATOR_KEY) can {what}", 403)

    async def remove_tenant(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The whole tenant is deleted: every agent's and member's keys are destroyed and every
        projection purges it (sent under the workspace agent). Only the deployment's own operator
        key (settings), never a key issued to the tenant. The answer comes once the ledger has
        recorded the erasure; keys and projections follow."""
        self._deployment_only(ctx, "remove a tenant")
        cmd = self._command(RemoveTenant, dataclasses.replace(ctx, agent=WORKSPACE), user=None)

        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self._rejected(events)
            return {"command_id": cmd.command_id, "status": "applied", "tenant": cmd.tenant}

        return {**await self.submit(cmd, wait, outcome), "tenant": cmd.tenant}

    def _rejected(self, events: list[Any]) -> None:
        for e in events:
            if e.type == "CommandRejected":
                raise ApiError(e.code, e.field, e.reason)

    def _consent_outcome(self, state: str) -> Any:
        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            async def shown() -> bool:
                return (await self.records.subject(cmd.tenant, cmd.agent, cmd.user)).consent == state

            result = await self._state_outcome(shown, f"consent {state} for {cmd.user}")(cmd, events)
            return {**result, "user": cmd.user, "consent": state}

        return outcome

    def _state_outcome(self, shown: Any, what: str) -> Any:
        """Answers once the view applied this command's own change: a concurrent command (a
        withdrawal racing this grant) may have changed the state since. `shown` is the first look."""
        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self._rejected(events)
            await self._applied(cmd, shown, what)
            return {"command_id": cmd.command_id, "status": "applied"}

        return outcome

    async def _applied(self, cmd: Any, shown: Any, what: str) -> None:
        """Until the view announces it applied `cmd`'s block or subject change, or shows it (`shown`)."""
        key = command_key(cmd.tenant, cmd.agent, cmd.command_id)
        applied = self.records.applied()

        async def mine() -> bool:
            return applied.announced(key) or await shown()

        await self._seen(cmd, key, 0, mine, what)

    async def _erase_outcome(self, cmd: Any, events: list[Any]) -> dict[str, Any]:
        """How many records were erased, once the view shows each one tombstoned or purged (the
        view drops an erased subject's rows and consent when it applies `SubjectErased`)."""
        self._rejected(events)
        erased = {e.record.id: e.record.version for e in events if e.type == "RecordDeleted"}
        withdrawn = any(e.type == "ConsentWithdrawn" for e in events)
        # The view purges the subject's consent when it applies `SubjectErased`, which a batch of
        # the projection may reach after the withdrawal: the answer waits for the purge too.
        purged = any(e.type == "SubjectErased" for e in events)

        async def shown() -> bool:
            consent = (await self.records.subject(cmd.tenant, cmd.agent, cmd.user)).consent
            if (withdrawn and consent == "granted") or (purged and consent is not None):
                return False
            found = {r.id: r.version for r in await self.records.get_many(cmd.tenant, cmd.agent, list(erased))}
            return all(found.get(rid, v) >= v for rid, v in erased.items())

        await self._until(cmd, shown, f"the erasure of {cmd.user}'s memory")
        return {"command_id": cmd.command_id, "status": "applied", "user": cmd.user, "erased": len(erased)}

    async def _until(self, cmd: Any, shown: Any, what: str) -> None:
        """Read-your-writes for what the view keeps outside records and blocks (consent,
        removals), which it does not announce: read again until it shows."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.READ_YOUR_WRITES_S
        while not await shown():
            if loop.time() >= deadline:
                raise ApiError(
                    ErrorCode.TIMEOUT, None,
                    f"command {cmd.command_id} was applied by the ledger, but the record view (the redis-projection "
                    f"worker) did not show {what} within {self.READ_YOUR_WRITES_S:g} s; check that worker")
            await asyncio.sleep(0.02)

    async def submit(self, cmd: Any, wait: bool, outcome: Any = None, ctx: Context | None = None) -> dict[str, Any]:
        """Sends `cmd`; with `wait`, answers its outcome: `outcome`'s, or the records it wrote
        that `ctx` may read (none without a `ctx`)."""
        data = encoded(cmd)
        # A cast, not an assert: a service built without shards fails a wait here as it always did.
        fut = cast("MemoryShards", self.memory).wait_for(cmd.command_id, cmd.tenant, cmd.agent) if wait else None
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
        if outcome is not None:
            return await outcome(cmd, events)
        return await self._outcome(cmd, events, ctx)

    async def _outcome(self, cmd: Any, events: list[Any], ctx: Context | None) -> dict[str, Any]:
        """What the command wrote, as its caller may read it: a record `ctx` could not read
        (`readable_by`, as the reads decide) is never in the answer, and never gives its id.
        (A command id another caller used before is answered with that caller's events.)"""
        self._rejected(events)
        result: dict[str, Any] = {"command_id": cmd.command_id, "status": "applied", "memories": []}
        for e in events:
            if e.type == "WriteStaged":
                result["status"] = "pending_turn"
            elif e.type == "WriteDiscarded":
                result["status"] = "discarded"
                result["reason"] = e.reason
            elif e.type == "BlockChanged":
                result["block"] = {"label": e.label, "text": e.text,
                                   **({"application": e.application} if e.application else {})}
            elif e.type == "RunEntryAdded":
                result["run_entry"] = {"id": e.entry_id, "run_id": e.run, "record_id": e.record_id}
            elif hasattr(e, "record"):
                if ctx is None or not readable_by(ctx, e.record):
                    continue
                result["memories"].append(e.record.model_dump(mode="json"))
                if getattr(e, "merged", False):
                    result["merged"] = True
                    result["id"] = e.record.id
                elif e.type in ("RecordAdded", "RecordDeleted", "RecordPinned", "RecordUnpinned", "RecordRevised"):
                    result.setdefault("id", e.record.id)
        # Read-your-writes: the Redis projection is a separate process; wait for it too, and
        # never answer "applied" for what a read right after would not show.
        if block := result.get("block"):
            at = block_field(block["label"], block.get("application"))  # as the view keys it

            async def block_shown() -> bool:
                return (await self.records.blocks(cmd.tenant, cmd.agent)).get(at, "") == block["text"]

            await self._applied(cmd, block_shown, f"block {block['label']}'s new text")
        if entry := result.get("run_entry"):
            await self._until(cmd, partial(self._entry_shown, cmd, entry), f"entry {entry['id']} of run {entry['run_id']}")
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

    async def _entry_shown(self, cmd: Any, entry: dict[str, Any]) -> bool:
        """Whether the run view (session memory, folded by the redis-projection worker) shows the entry."""
        entries, _ = await RunView(self.records).session(cmd.tenant, cmd.agent, entry["run_id"], utcnow(),
                                                     cmd.user)
        return any(x.id == entry["id"] for x in entries)

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
