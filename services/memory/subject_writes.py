"""Subject writes: consent, erasure, and removing and restoring an agent, a member or a tenant.

Who sends each: a member grants their own consent, and the member or an operator naming them
withdraws it; an operator erases a member's memory and removes or restores an agent or a member;
only the deployment's own operator key removes or restores a tenant. Each answers once the
record view shows the subject's new state.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from events.commands import (
    WORKSPACE,
    EraseSubject,
    GrantConsent,
    RemoveAgent,
    RemoveTenant,
    RemoveUser,
    RestoreTenant,
    RestoreUser,
    WithdrawConsent,
)
from events.errors import ErrorCode
from services.errors import ApiError
from services.memory.context import Context
from services.memory.rules import check_role
from services.memory.submission import CommandSubmission

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords


class SubjectCommands(Protocol):
    """What subject writes use of the memory commands: the record view, and how a command is
    made for a caller and submitted."""

    records: RedisRecords

    def _command(self, cls: type, ctx: Context, **fields: Any) -> Any: ...

    async def submit(self, cmd: Any, wait: bool, outcome: Any = None, ctx: Context | None = None) -> dict[str, Any]: ...


class SubjectWrites:
    def __init__(self, commands: SubjectCommands, sending: CommandSubmission) -> None:
        self.commands = commands
        self.sending = sending

    async def grant_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The member lets the agent keep and use memory about them: only the member's own key
        grants it (granting consent is explicit)."""
        check_role(ctx, ("member",), "grant consent: the member grants it with their own key")
        await self.check_not_removed(ctx.tenant, ctx.agent, ctx.user)
        cmd = self.commands._command(GrantConsent, ctx)
        return await self.commands.submit(cmd, wait, self.sending.consent_outcome("granted"))

    async def withdraw_consent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """Stops new writes and recall for the member at once and deletes nothing: the member's
        own key, or an operator key naming the member (X-User)."""
        check_role(ctx, ("member", "operator"), "withdraw consent: the member, or an operator naming them")
        if ctx.user is None:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-user", "x-user: name the member whose consent to "
                           "withdraw (X-User)", 422)
        cmd = self.commands._command(WithdrawConsent, ctx)
        return await self.commands.submit(cmd, wait, self.sending.consent_outcome("withdrawn"))

    async def erase_subject(self, ctx: Context, user: str, wait: bool = True) -> dict[str, Any]:
        """An operator erases a member's memory on the agent: every live user-scope record of
        theirs is tombstoned and their consent withdrawn. The answer counts; it never shows a fact."""
        check_role(ctx, ("operator",), "erase a member's memory")
        cmd = self.commands._command(EraseSubject, ctx, user=user)
        return await self.commands.submit(cmd, wait, self.sending.erase_outcome)

    async def remove_agent(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The agent is soft-deleted: its memory is never served again, and no write is accepted."""
        check_role(ctx, ("operator",), "remove an agent")
        cmd = self.commands._command(RemoveAgent, ctx)

        async def shown() -> bool:
            return (await self.commands.records.subject(cmd.tenant, cmd.agent, None)).agent_removed

        return await self.commands.submit(cmd, wait, self.sending.state_outcome(shown, f"agent {cmd.agent} removed"))

    async def remove_user(self, ctx: Context, user: str, wait: bool = True, erase: bool = True) -> dict[str, Any]:
        """The member leaves the tenant: no agent serves their memory until they are restored
        (sent under the workspace agent, as it holds for every agent). `erase`: the user is
        deleted, and the ledger destroys their data keys on every agent; without it their facts
        are kept."""
        check_role(ctx, ("operator",), "remove a member")
        cmd = self.commands._command(RemoveUser, dataclasses.replace(ctx, agent=WORKSPACE), user=user, erase=erase)

        async def shown() -> bool:
            return (await self.commands.records.subject(cmd.tenant, WORKSPACE, user)).user_removed

        return await self.commands.submit(cmd, wait, self.sending.state_outcome(shown, f"member {user} removed"))

    async def check_not_removed(self, tenant: str, agent: str | None, user: str | None) -> None:
        """A removed tenant or member stays removed until an operator restores them: no key is
        issued to them and no consent of theirs is granted before that (403 SUBJECT_REMOVED
        naming what to restore)."""
        state = await self.commands.records.subject(tenant, agent or WORKSPACE, user)
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
        cmd = self.commands._command(RestoreUser, dataclasses.replace(ctx, agent=WORKSPACE), user=user)

        async def shown() -> bool:
            return not (await self.commands.records.subject(cmd.tenant, WORKSPACE, user)).user_removed

        return await self.commands.submit(cmd, wait, self.sending.state_outcome(shown, f"member {user} restored"))

    async def restore_tenant(self, ctx: Context, wait: bool = True) -> dict[str, Any]:
        """The deployment's operator restores a removed tenant: keys may be issued in it again.
        Nothing erased comes back."""
        self._deployment_only(ctx, "restore a tenant")
        cmd = self.commands._command(RestoreTenant, dataclasses.replace(ctx, agent=WORKSPACE), user=None)

        async def shown() -> bool:
            return not (await self.commands.records.subject(cmd.tenant, WORKSPACE, None)).tenant_removed

        outcome = self.sending.state_outcome(shown, f"tenant {cmd.tenant} restored")
        return {**await self.commands.submit(cmd, wait, outcome), "tenant": cmd.tenant}

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
        cmd = self.commands._command(RemoveTenant, dataclasses.replace(ctx, agent=WORKSPACE), user=None)

        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self.sending.rejected(events)
            return {"command_id": cmd.command_id, "status": "applied", "tenant": cmd.tenant}

        return {**await self.commands.submit(cmd, wait, outcome), "tenant": cmd.tenant}
