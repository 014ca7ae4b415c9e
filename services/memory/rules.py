"""Who may call what: the checks every memory call makes before it reads or writes (pure)."""

from __future__ import annotations

from events.config import AgentConfig
from events.errors import ErrorCode
from services.errors import ApiError
from services.memory.context import Context


def check_enabled(ctx: Context, cfg: AgentConfig, kill_switch: bool) -> None:
    """With memory off, an agent's memory calls are refused at once. An operator still lists,
    reads and deletes (the dashboard, and deletion)."""
    if ctx.principal.role == "operator":
        return
    if kill_switch:
        raise ApiError(ErrorCode.MEMORY_DISABLED, "AGENT_MEMORY_KILL_SWITCH",
                       "memory is switched off for this deployment; unset AGENT_MEMORY_KILL_SWITCH to turn it on")
    if not cfg.memory.enabled:
        raise ApiError(ErrorCode.MEMORY_DISABLED, "memory.enabled",
                       "memory is off for this agent; an operator sets memory.enabled to true to turn it on")


def check_tool(ctx: Context, cfg: AgentConfig, tool: str, kill_switch: bool) -> None:
    """A write by `tool`: the key may write, memory is on, and the agent's configuration offers the tool."""
    if not ctx.principal.can_write:
        raise ApiError(ErrorCode.READ_ONLY_KEY, None, "this key can search memory but never write it")
    check_enabled(ctx, cfg, kill_switch)
    if ctx.principal.role != "operator" and tool not in cfg.memory.tools:
        raise ApiError(
            ErrorCode.TOOL_NOT_ALLOWED, "tool", f"{tool} is not in memory.tools {cfg.memory.tools}; nothing was changed"
        )
