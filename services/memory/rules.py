"""Who may call what: the checks every memory call makes before it reads or writes (pure)."""

from __future__ import annotations

from events.config import AgentConfig
from events.errors import ErrorCode
from events.rules.subjects import Refusal
from services.errors import ApiError
from services.memory.context import Context


def check_enabled(ctx: Context, cfg: AgentConfig, kill_switch: bool) -> None:
    """With memory off, an agent's memory calls are refused at once. An operator still lists,
    reads and deletes (the dashboard, and deletion), and a member still lists, reads, edits and
    deletes their own facts and changes their consent (seed 004's Memory tab)."""
    if ctx.principal.role in ("operator", "member"):
        return
    if kill_switch:
        raise ApiError(ErrorCode.MEMORY_DISABLED, "AGENT_MEMORY_KILL_SWITCH",
                       "memory is switched off for this deployment; unset AGENT_MEMORY_KILL_SWITCH to turn it on")
    if not cfg.memory.enabled:
        raise ApiError(ErrorCode.MEMORY_DISABLED, "memory.enabled",
                       "memory is off for this agent; an operator sets memory.enabled to true to turn it on")


def check_tool(ctx: Context, cfg: AgentConfig, tool: str, kill_switch: bool) -> None:
    """A write by `tool`: the key may write, memory is on, and the agent's configuration offers the tool."""
    if ctx.principal.role == "member":
        raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"a member key edits and deletes the member's own facts "
                       f"and grants or withdraws consent; {tool} is the agent's tool, not a member's", 403)
    if not ctx.principal.can_write:
        raise ApiError(ErrorCode.READ_ONLY_KEY, "authorization", "this key can search memory but never write it")
    check_enabled(ctx, cfg, kill_switch)
    if ctx.principal.role != "operator" and tool not in cfg.memory.tools:
        raise ApiError(
            ErrorCode.TOOL_NOT_ALLOWED, "tool", f"{tool} is not in memory.tools {cfg.memory.tools}; nothing was changed"
        )


def check_role(ctx: Context, allowed: tuple[str, ...], what: str) -> None:
    """403 FORBIDDEN naming the key (`authorization`) unless its role is one of `allowed`."""
    if ctx.principal.role not in allowed:
        who = " or ".join(f"{r} key" for r in allowed)
        raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"only {'an' if who[0] in 'aeiou' else 'a'} {who} "
                       f"can {what}", 403)


def refused(refusal: Refusal | None) -> None:
    """A subject's refusal (events.rules.subjects) as the API answers it: 403 with its code and field."""
    if refusal is not None:
        raise ApiError(refusal.code, refusal.field, refusal.reason, 403)
