"""Whether a subject (tenant + user + agent) may have memory now: consent, channel, removal (pure).

Every entry point asks the same question: the API before a read or a tool write, the
extraction worker before a review, and the ledger, last, before it applies a write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from events.config import AgentConfig, channel_allowed
from events.errors import ErrorCode


@dataclass(frozen=True)
class SubjectState:
    """What the record view knows of a subject: its consent and whether it was removed."""

    consent: Literal["granted", "withdrawn"] | None = None
    agent_removed: bool = False
    user_removed: bool = False
    tenant_removed: bool = False


@dataclass(frozen=True)
class Refusal:
    code: ErrorCode
    field: str
    reason: str
    # The `MemorySkipped` reason a worker records for a turn refused so.
    skipped: Literal["consent_required", "channel_not_allowed", "subject_removed"]


def consent_needed(cfg: AgentConfig) -> bool:
    return cfg.memory.consent == "required"


def refusal(cfg: AgentConfig, user: str | None, channel: str | None, state: SubjectState) -> Refusal | None:
    """Why the subject gets no memory (no recall, no injection, no writes), or None."""
    if state.tenant_removed:
        return Refusal(ErrorCode.SUBJECT_REMOVED, "tenant", "this tenant was removed; its memory is not served",
                       "subject_removed")
    if state.agent_removed:
        return Refusal(ErrorCode.SUBJECT_REMOVED, "agent", "this agent was removed; its memory is not served",
                       "subject_removed")
    if state.user_removed:
        return Refusal(ErrorCode.SUBJECT_REMOVED, "user", "this member was removed; their memory is not served",
                       "subject_removed")
    if not channel_allowed(cfg, channel):
        return Refusal(ErrorCode.CHANNEL_NOT_ALLOWED, "channel",
                       f"channel {channel!r} does not use memory; memory.channels is {cfg.memory.channels}",
                       "channel_not_allowed")
    if consent_needed(cfg) and state.consent != "granted":
        if user is None:
            reason = "this agent requires a member's consent (memory.consent); name the member (X-User)"
        elif state.consent == "withdrawn":
            reason = "the member withdrew consent; memory stays off until they grant it again"
        else:
            reason = "the member has not granted consent; they grant it with a member key (POST /v1/consent)"
        return Refusal(ErrorCode.CONSENT_REQUIRED, "user", reason, "consent_required")
    return None
