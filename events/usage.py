"""`memlane.usage`, keyed by tenant/agent: model calls, embeddings, retrievals, audits."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from events.base import Ident, Message_


class _UsageBase(Message_):
    usage_id: Ident
    tenant: Ident
    agent: Ident
    occurred_at: datetime
    session: Ident | None = None
    execution_id: Ident | None = None
    turn: int | None = None


class ModelUsage(_UsageBase):
    """One model or embedding call. Purpose `embed` is recorded but counted by no limit."""

    type: Literal["ModelUsage"] = "ModelUsage"
    purpose: Literal["memory", "consolidation", "embed"]
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    ok: bool = True
    error: str | None = None


class RetrievedItem(Message_):
    id: str
    version: int | None = None


class Retrieved(_UsageBase):
    """A search or recall whose results reached the model: a `RETRIEVED` output use."""

    type: Literal["Retrieved"] = "Retrieved"
    tool: Literal["search_memory", "recall", "search_history"]
    recall: bool = False
    conversation: str | None = None
    items: list[RetrievedItem] = []


class PinnedListed(_UsageBase):
    """The pinned record versions a recall put before the model, every time: pins are listed
    each turn, so unlike `Retrieved` a version already shown in the conversation is listed again."""

    type: Literal["memory.pinned"] = "memory.pinned"
    conversation: str | None = None
    items: list[RetrievedItem]


class CandidateRefused(_UsageBase):
    """The write-time filter refused an extraction candidate, with its reason."""

    type: Literal["CandidateRefused"] = "CandidateRefused"
    reason: str
    summary_preview: str = ""


class MemorySkipped(_UsageBase):
    """A turn got no memory work (no review, no tool writes) and why: the subject has no
    consent, the session's channel is not a memory channel, the turn did not complete, or the
    agent or member was removed."""

    type: Literal["MemorySkipped"] = "MemorySkipped"
    user: Ident | None = None
    reason: Literal["consent_required", "channel_not_allowed", "turn_not_completed", "subject_removed"]
    detail: str = ""


class Decision(Message_):
    """One write a review decided: the record it adds (its id as the ledger will give it) and
    the one it replaces, or the record it deletes."""

    decision: Literal["add", "replace", "delete"]
    record_id: str
    replaces: str | None = None
    kind: str | None = None


class TurnReviewed(_UsageBase):
    """A review of a session's messages finished with this turn: what it decided (the ledger
    then writes each decision, or refuses it). Counts and ids, never text."""

    type: Literal["TurnReviewed"] = "TurnReviewed"
    user: Ident | None = None
    decided: list[Decision] = []
    skipped: int = 0
    refused: int = 0


UsageEvent = Annotated[ModelUsage | Retrieved | PinnedListed | CandidateRefused | MemorySkipped | TurnReviewed,
                       Field(discriminator="type")]
