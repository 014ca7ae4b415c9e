"""An agent's own commands: its configuration, and its blocks kept line by line."""

from __future__ import annotations

from events.commands import BLOCK_CHARS, ConfigureAgent, CurateBlock, block_field, block_of_field
from events.config import label_numbers_kept
from events.errors import ErrorCode
from events.memory import AgentConfigured, BlockChanged
from events.rules.ledger.state import MAX_APPLICATIONS, MAX_BLOCKS, LedgerState, Rejected, config_of, event_base


def decide_configure(state: LedgerState, ak: str, cmd: ConfigureAgent, events: list) -> None:
    old = state.configs.get(ak)
    if old:
        changed = label_numbers_kept(old, cmd.config)
        if changed:
            raise Rejected(
                ErrorCode.VALIDATION_FAILED,
                f"memory.labels.{changed}",
                f"label {changed!r} was declared with a number; it keeps that number and cannot be removed",
            )
    events.append(event_base(AgentConfigured, cmd, config=cmd.config))


def decide_curate(state: LedgerState, ak: str, cmd: CurateBlock, events: list) -> None:
    """A block is kept line by line, up to `BLOCK_CHARS`. A line already there is
    not added twice; `replace` and `remove` name the line to change as it is now."""
    if not config_of(state, ak).memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.preview:
        raise Rejected(ErrorCode.PREVIEW_READ_ONLY, "label",
                       "blocks are live memory for every turn; a preview turn cannot change them")
    # An application's blocks are kept apart from the agent's own (`block_field`), and counted
    # apart: each recall shows one application's beside the agent's, `MAX_BLOCKS` of each at most.
    at = block_field(cmd.label, cmd.application)
    held = state.blocks.get(ak) or {}
    apps = {block_of_field(k)[0] for k in held} - {None}
    if cmd.application and cmd.application not in apps and len(apps) >= MAX_APPLICATIONS:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "application",
                       f"the agent has blocks for {len(apps)} applications, the limit is {MAX_APPLICATIONS}; "
                       "empty one application's blocks first")
    blocks = {k: v for k, v in held.items() if block_of_field(k)[0] == cmd.application}
    if at not in blocks and len(blocks) >= MAX_BLOCKS:
        whose = f"application {cmd.application!r}" if cmd.application else "the agent"
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "label",
                       f"{whose} has {len(blocks)} blocks, the limit is {MAX_BLOCKS}; add to one of them or empty one")
    text = blocks.get(at, "")
    lines = text.split("\n") if text else []
    if cmd.action == "add":
        lines = lines if cmd.line in lines else [*lines, cmd.line]
    else:
        if cmd.old not in lines:
            raise Rejected(ErrorCode.NOT_FOUND, "old",
                           f"block {cmd.label!r} has no line {cmd.old[:80]!r}; read the block first")
        at = lines.index(cmd.old)
        lines = [*lines[:at], *([cmd.line] if cmd.action == "replace" else []), *lines[at + 1 :]]
    new = "\n".join(dict.fromkeys(lines))
    if len(new) > BLOCK_CHARS:
        raise Rejected(
            ErrorCode.LIMIT_EXCEEDED, "line",
            f"block {cmd.label!r} would hold {len(new)} characters, over the limit of {BLOCK_CHARS}; replace or remove lines",
        )
    events.append(event_base(BlockChanged, cmd, label=cmd.label, text=new, application=cmd.application))
