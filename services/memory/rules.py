"""Who may call what: the checks every memory call makes before it reads or writes (pure)."""

from __future__ import annotations

from events.config import AgentConfig
from events.errors import ErrorCode
from events.record import MemoryRecord, Scope
from events.rules.history import across_conversations
from events.rules.subjects import Refusal
from events.rules.visibility import visible
from services.auth import Principal
from services.errors import ApiError
from services.memory.context import Context

# Every role but a member's: the keys that use an agent's memory or administer it.
NOT_MEMBER = ("agent", "helper", "operator")
MEMBER_DOES = ("a member key lists, reads, edits and deletes its member's own facts, reads and writes its member's "
               "profile, and grants or withdraws consent")


def check_role(who: Context | Principal, allowed: tuple[str, ...], what: str) -> None:
    """The one role guard: 403 FORBIDDEN naming the key (`authorization`) unless its role is
    one of `allowed`. A member key is told what it can do instead."""
    p = who.principal if isinstance(who, Context) else who
    if p.role in allowed:
        return
    keys = allowed[0] if len(allowed) == 1 else f"{', '.join(allowed[:-1])} or {allowed[-1]}"
    msg = f"only {'an' if keys[0] in 'aeiou' else 'a'} {keys} key can {what}"
    raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"{msg}; {MEMBER_DOES}" if p.role == "member" else msg, 403)


def members_data(ctx: Context, r: MemoryRecord) -> bool:
    """Whether `r` is a member's data kept from `ctx`: an operator never reads a record that
    names a member (their USER facts, and what else was made from their turns, in any scope)."""
    return ctx.principal.role == "operator" and r.user is not None


def shown_to(ctx: Context, r: MemoryRecord, scopes: tuple[str, ...] | None = None) -> bool:
    """`visible`, less a member's data an operator may not read (`members_data`)."""
    return visible(r, ctx, scopes) and not members_data(ctx, r)


def readable_by(ctx: Context, r: MemoryRecord) -> bool:
    """Whether `ctx` may read (and so address, or be shown in an answer) record `r`, whatever
    its status: an operator any record of the agent but a member's data (`members_data`), a
    member only their own facts, an agent or helper what `visible` lets it. The one rule of
    reads, write answers and the records a write names."""
    role = ctx.principal.role
    if role == "operator":
        return not members_data(ctx, r) and r.tenant == ctx.tenant and r.agent == ctx.agent
    if role == "member":
        return r.scope is Scope.USER and visible(r, ctx)
    return visible(r, ctx)


def default_kind(cfg: AgentConfig) -> str:
    """The kind of a write that names none: "fact" where the agent declares it, else the
    agent's first declared kind (the member-facts preset declares profile, semantic, episodic)."""
    kinds = cfg.memory.kinds
    return "fact" if "fact" in kinds or not kinds else kinds[0]


def check_kind_named(cfg: AgentConfig, kind: str | None) -> None:
    """With `memory.kinds_required`, every write names a declared kind: 400 otherwise."""
    declared = ", ".join(cfg.memory.kinds)
    if not kind:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "kind", f"kind is required on every write "
                       f"(memory.kinds_required); declared kinds: {declared}", 400)
    if kind not in cfg.memory.kinds:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "kind", f"kind {kind!r} is not declared; declared kinds: "
                       f"{declared}", 400)


def check_enabled(ctx: Context, cfg: AgentConfig, kill_switch: bool) -> None:
    """With memory off, an agent's memory calls are refused at once. An operator still lists,
    reads and deletes (the dashboard, and deletion), and a member still lists, reads, edits and
    deletes their own facts and changes their consent (the Memory tab)."""
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
        raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"{MEMBER_DOES}; {tool} is the agent's tool, not a "
                       "member's", 403)
    if not ctx.principal.can_write:
        raise ApiError(ErrorCode.READ_ONLY_KEY, "authorization", "this key can search memory but never write it")
    check_enabled(ctx, cfg, kill_switch)
    check_offered(ctx, cfg, tool)


def check_offered(ctx: Context, cfg: AgentConfig, tool: str) -> None:
    """An agent's key writes with `tool` only where the agent's configuration offers it
    (memory.tools); an operator's or a member's write is not the agent's tool call."""
    if ctx.principal.role in ("agent", "helper") and tool not in cfg.memory.tools:
        raise ApiError(
            ErrorCode.TOOL_NOT_ALLOWED, "tool", f"{tool} is not in memory.tools {cfg.memory.tools}; nothing was changed"
        )


def check_across(cfg: AgentConfig, field: str, what: str) -> None:
    """`what` reaches another session of the agent: 403 unless history across conversations is on."""
    if not across_conversations(cfg):
        raise ApiError(ErrorCode.HISTORY_DISABLED, field,
                       f"{what}: history across conversations is off for this agent; set "
                       "harness.history.across_conversations to true, or search the caller's session", 403)


def check_operator_write(ctx: Context, scope: Scope | None = None) -> None:
    """An operator never writes a member's memory: its write names no member (X-User) and
    asks for no user scope. (It names a member only to withdraw their consent, and erases or
    removes one by the path.) The ledger refuses the same, last."""
    if ctx.principal.role != "operator":
        return
    if ctx.user is not None:
        raise ApiError(ErrorCode.FORBIDDEN, "x-user", "x-user: an operator key never writes a member's memory; "
                       "leave X-User out (it names a member only to withdraw their consent)", 403)
    if scope is Scope.USER:
        raise ApiError(ErrorCode.FORBIDDEN, "scope", "scope: an operator key never writes a member's (USER) "
                       "facts; the agent writes them for its member", 403)


def refused(refusal: Refusal | None) -> None:
    """A subject's refusal (events.rules.subjects) as the API answers it: 403 with its code and field."""
    if refusal is not None:
        raise ApiError(refusal.code, refusal.field, refusal.reason, 403)
