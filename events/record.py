"""The memory record and its provenance: who wrote each version, when, and in which turn."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from events.base import Ident, Message_

MAX_SUMMARY_BYTES = 512
MAX_CONTENT_BYTES = 16 * 1024


class Scope(str, Enum):
    SESSION = "SESSION"
    AGENT = "AGENT"
    # One member's facts on one agent: every session of that user, and no one else.
    USER = "USER"


class Status(str, Enum):
    ACTIVE = "ACTIVE"
    PENDING = "PENDING"
    CONFLICT = "CONFLICT"
    SUPERSEDED = "SUPERSEDED"
    DELETED = "DELETED"


class Source(str, Enum):
    EXTRACTION = "EXTRACTION"
    TOOL = "TOOL"
    OPERATOR = "OPERATOR"
    # The member a user-scope fact belongs to, editing or deleting it with a member key.
    MEMBER = "MEMBER"
    CONSOLIDATION = "CONSOLIDATION"


def check_utf8_limit(value: str, limit: int, what: str) -> str:
    size = len(value.encode())
    if size > limit:
        raise ValueError(f"{what} is {size} bytes; the limit is {limit} bytes")
    return value


def _limit(limit: int, what: str):
    return AfterValidator(lambda v: check_utf8_limit(v, limit, what))


# Limits are in UTF-8 bytes, as stored, not in characters.
Summary = Annotated[str, Field(min_length=1), _limit(MAX_SUMMARY_BYTES, "summary")]
Content = Annotated[str, _limit(MAX_CONTENT_BYTES, "content")]


class Provenance(Message_):
    """Who and what caused a change, so anyone can answer 'why is this here?'."""

    source: Source = Source.TOOL
    execution_id: Ident | None = None
    invocation: int | None = None
    agent_version: int | None = None
    session: Ident | None = None
    user: Ident | None = None
    turn: int | None = None
    modified_by: str = "agent"
    # Extraction only: which model, which prompt, which memories it was shown.
    model: str | None = None
    prompt_version: str | None = None
    candidates: list[str] = []
    source_message_ids: list[str] = []
    # The episode (a consolidated session) this change came from: set on what consolidation
    # distils from a run, and on the run's extraction-made facts once its episode exists.
    episode: Ident | None = None
    # Where the writer found it: a URL, a document or ticket id (its own words, at most 512 characters).
    source_ref: Annotated[str, Field(max_length=512)] | None = None


# Statuses that count toward the live-fact cap and can expire.
LIVE = (Status.ACTIVE, Status.PENDING, Status.CONFLICT)


class MemoryRecord(Message_):
    id: Ident
    version: Annotated[int, Field(ge=1)]
    created: datetime
    modified: datetime
    tenant: Ident
    agent: Ident
    scope: Scope
    session: Ident | None = None
    # The member the record is about (tenant + user + agent is a subject); set on
    # every USER record, and on other records written in a turn that named its user.
    user: Ident | None = None
    kind: Annotated[str, Field(min_length=1, max_length=64)]
    summary: Summary
    content: Content = ""
    metadata: dict[str, Any] = {}
    labels: dict[str, str] = {}
    key: str | None = None
    confidence: Annotated[float, Field(ge=0, le=1)] | None = None
    # Trust inputs (docs/features/trust.md). `importance` is the writer's; `usage_count` (times the
    # record reached the model) and `utility` (reported outcomes) are learned. Usage changes
    # them without a new version: usage is not content (`events.rules.ledger.usage`).
    importance: Annotated[float, Field(ge=0, le=1)] = 0.5
    usage_count: Annotated[int, Field(ge=0)] = 0
    utility: Annotated[float, Field(ge=0, le=1)] = 0.5
    expires_at: datetime | None = None
    status: Status = Status.ACTIVE
    pinned: bool = False
    replaces: Ident | None = None
    replaced_by: Ident | None = None
    preview: bool = False
    provenance: Provenance = Provenance()
    # Policy: free-form tags (filterable, like labels) and the writer's classification of it
    # (say "internal" or "confidential"); who sees it is its scope.
    tags: list[str] = []
    classification: str | None = None
    # Bi-temporal fields: when a fact was observed and when it holds, beside when it was recorded.
    observed_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    recorded_at: datetime | None = None
    superseded_at: datetime | None = None
    # How many later writes from other runs restated this fact (`events.rules.procedures.confirm`).
    confirmations: Annotated[int, Field(ge=0)] = 0

    def in_force(self, now: datetime) -> bool:
        """ACTIVE and not past its expiry. A sweep tombstones expired records later;
        reads stop serving them at once."""
        return self.status is Status.ACTIVE and (self.expires_at is None or self.expires_at > now)

    @property
    def text(self) -> str:
        """What gets embedded and indexed."""
        return f"{self.summary}\n{self.content}".strip()
