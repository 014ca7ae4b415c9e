"""Member profiles over the API, MCP and recall (docs/features/profiles.md): who may read, write and
delete a member's profile, the commands sent to the ledger, and recall's "User profile" layer.

Who: the member's own key, or an agent key speaking for that member (X-User names the member
the path names); a helper key reads as its agent does, never writes. An operator key never
reads or writes a member's profile, but may delete it. The agent's calls are held to the one
subject rule (consent, channel, removal), as its user-scope facts are; the ledger checks
consent again, last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from events.commands import DeleteProfile, SetProfile
from events.config import AgentConfig
from events.errors import ErrorCode
from events.record import Source
from events.rules.recall_render import Entry
from events.rules.subjects import SubjectState, refusal
from projections.redis.profile_view import Profile, ProfileView
from services.errors import ApiError
from services.memory.context import Context
from services.memory.ports import RecallAsk
from services.memory.rules import check_enabled, check_offered, refused

if TYPE_CHECKING:
    from services.memory.commands import MemoryCommands
    from services.memory.reads import MemoryReads

LAYER = "User profile"
WRITE_TOOL = "profile_write"  # memory.tools: an agent key writes and deletes a profile only with it


def check_access(ctx: Context, user: str, action: str) -> None:
    """Whether `ctx` may `action` ("read", "write", "delete") the profile of `user`: 403 (or
    422 for an agent key that names no member), naming the field to fix."""
    role = ctx.principal.role
    if role == "operator":
        if action != "delete":
            raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"an operator key never {action}s a member's "
                           "profile; it may delete it (DELETE /v1/profiles/{user})", 403)
        return
    if role == "member":
        if ctx.user != user:
            raise ApiError(ErrorCode.FORBIDDEN, "user", "a member key reads and writes its own member's profile "
                           "only", 403)
        return
    if ctx.user is None:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "x-user", "x-user: an agent reads and writes the profile of "
                       "the member it speaks for; name them (X-User)", 422)
    if ctx.user != user:
        raise ApiError(ErrorCode.FORBIDDEN, "user", "an agent key reaches the profile of the member it speaks for "
                       "(X-User) only", 403)
    if action != "read" and not ctx.principal.can_write:
        raise ApiError(ErrorCode.READ_ONLY_KEY, "authorization", "this key can read memory but never write it")


def layer_entries(profile: Profile | None) -> dict[str, list[Entry]]:
    """Recall's "User profile" layer: the member's profile, titled "Profile"; the member's id
    stays out of the rendered text (it is in the JSON, as `user`)."""
    if profile is None:
        return {}
    return {LAYER: [Entry(id="profile", text=profile.text, title="Profile",
                          extra=(("user", profile.user), ("version", profile.version)))]}


class MemoryProfiles:
    def __init__(self, reads: MemoryReads, commands: MemoryCommands) -> None:
        self.reads, self.commands = reads, commands
        self.view = ProfileView(reads.records)

    async def _check(self, ctx: Context, user: str, action: str) -> AgentConfig:
        check_access(ctx, user, action)
        cfg = await self.reads.config(ctx.tenant, ctx.agent)
        check_enabled(ctx, cfg, self.reads.settings.memory_kill_switch)
        if action != "read":
            check_offered(ctx, cfg, WRITE_TOOL)
        state = await self.reads.records.subject(ctx.tenant, ctx.agent, user)
        if ctx.principal.role in ("agent", "helper"):
            refused(refusal(cfg, user, ctx.channel, state))  # consent, channel, removal
        elif state.agent_removed or state.user_removed:
            refused(refusal(cfg, user, None, SubjectState(agent_removed=state.agent_removed,
                                                          user_removed=state.user_removed)))
        return cfg

    async def read(self, ctx: Context, user: str) -> dict[str, Any]:
        await self._check(ctx, user, "read")
        got = await self.view.read(ctx.tenant, ctx.agent, user)
        if got is None:
            raise ApiError(ErrorCode.NOT_FOUND, "user", "this member has no profile on this agent; write one "
                           "(PUT /v1/profiles/{user})", 404)
        return got.as_json()

    async def write(self, ctx: Context, user: str, text: str, expected_version: int | None = None,
                    wait: bool = True) -> dict[str, Any]:
        await self._check(ctx, user, "write")
        self.commands._screen(ctx, text=text)
        cmd = self.commands._command(SetProfile, ctx, user=user, text=text, expected_version=expected_version)
        return await self.commands.submit(cmd, wait, self._outcome)

    async def delete(self, ctx: Context, user: str, expected_version: int | None = None,
                     wait: bool = True) -> dict[str, Any]:
        await self._check(ctx, user, "delete")
        cmd = self.commands._command(DeleteProfile, ctx, user=user, expected_version=expected_version)
        return await self.commands.submit(cmd, wait, self._outcome)

    async def _outcome(self, cmd: Any, events: list[Any]) -> dict[str, Any]:
        """Applied once the view shows the new version (or the deletion): read-your-writes."""
        self.commands._rejected(events)
        changed = next(e for e in events if e.type == "ProfileChanged")

        async def shown() -> bool:
            got = await self.view.read(cmd.tenant, cmd.agent, changed.user)
            return got is None if not changed.text else got is not None and got.version >= changed.version

        await self.commands._until(cmd, shown, f"version {changed.version} of the profile")
        out = {"command_id": cmd.command_id, "status": "applied", "user": changed.user, "version": changed.version}
        if cmd.provenance.source is not Source.OPERATOR:
            out["text"] = changed.text  # the member's, or the agent's speaking for them: theirs to see
        return out

    async def layer(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """The `LayerSource` of recall's "User profile": the profile of the member the recall
        names and only theirs; none for an operator key, or with no member named. The recall
        has already been refused when the subject may not have memory (consent, removal)."""
        ctx = ask.ctx
        if ctx.user is None or ctx.principal.role not in ("agent", "helper"):
            return {}
        return layer_entries(await self.view.read(ctx.tenant, ctx.agent, ctx.user))
