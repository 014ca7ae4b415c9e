"""Events on `memlane.memory.events`, keyed by tenant/agent: the source of truth.

Every record-changing event carries the full record snapshot at its new version, so a
projection is a version-guarded upsert and never needs to read what it already has.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from events.base import Ident, Message_
from events.commands import MergeEvidence, NoteSource
from events.config import AgentConfig
from events.record import MemoryRecord, Provenance


class _EventBase(Message_):
    event_id: Ident
    command_id: Ident
    tenant: Ident
    agent: Ident
    occurred_at: datetime
    provenance: Provenance = Provenance()
    # False on all but the last event a command produced: a reader that waits for a
    # command's outcome waits for this one.
    last: bool = True


class _RecordEvent(_EventBase):
    record: MemoryRecord


class RecordAdded(_RecordEvent):
    type: Literal["RecordAdded"] = "RecordAdded"
    # True when the write restated a live record and was merged into it.
    merged: bool = False
    # A near-duplicate merge's evidence, as the ledger checked it (events.rules.near_duplicate);
    # None for an exact restatement and for every new record.
    merge: MergeEvidence | None = None


class RecordSuperseded(_RecordEvent):
    type: Literal["RecordSuperseded"] = "RecordSuperseded"


class RecordDeleted(_RecordEvent):
    type: Literal["RecordDeleted"] = "RecordDeleted"


class RecordExpired(_RecordEvent):
    """A sweep tombstoned a live record past its `expires_at`: status DELETED."""

    type: Literal["RecordExpired"] = "RecordExpired"


class RecordPinned(_RecordEvent):
    type: Literal["RecordPinned"] = "RecordPinned"


class RecordUnpinned(_RecordEvent):
    type: Literal["RecordUnpinned"] = "RecordUnpinned"


class RecordRestored(_RecordEvent):
    """An undo brought a record back to the version that stood before the undone writes: a new
    version with that version's status, pin and expiry (`events.rules.undo`)."""

    type: Literal["RecordRestored"] = "RecordRestored"


class RecordRevised(_RecordEvent):
    """A procedure's counts after an outcome was reported for it: a new version
    with the same text."""

    type: Literal["RecordRevised"] = "RecordRevised"


class EpisodeLinked(_RecordEvent):
    """A fact extraction made during a run, once the run's episode exists: a new version with
    the same text whose `provenance.episode` names the episode."""

    type: Literal["EpisodeLinked"] = "EpisodeLinked"
    episode: Ident


class WriteStaged(_EventBase):
    """A write made inside a turn, held until the turn's outcome. Not a record."""

    type: Literal["WriteStaged"] = "WriteStaged"
    turn_ref: str
    command: str  # the staged command's JSON, so the ledger's state folds from events alone


class TurnResolved(_EventBase):
    """A turn's outcome reached the ledger; writes staged for it were applied or discarded."""

    type: Literal["TurnResolved"] = "TurnResolved"
    turn_ref: str
    committed: bool
    # No outcome came within the turn timeout: the ledger gave up on the turn.
    timed_out: bool = False


class WriteDiscarded(_EventBase):
    type: Literal["WriteDiscarded"] = "WriteDiscarded"
    turn_ref: str
    reason: str


class AgentConfigured(_EventBase):
    type: Literal["AgentConfigured"] = "AgentConfigured"
    config: AgentConfig


class BlockChanged(_EventBase):
    """A memory block's whole text after a curation; empty once its last line is removed."""

    type: Literal["BlockChanged"] = "BlockChanged"
    label: str
    text: str
    application: str | None = None  # an application-scoped block's application; absent: none


class ProfileChanged(_EventBase):
    """A member's profile on the agent after a write, whole, at `version` (1 for the first);
    empty text: the profile was deleted. `added`/`skipped`: an enrichment's lines appended and
    left out (already there, or over the limit)."""

    type: Literal["ProfileChanged"] = "ProfileChanged"
    user: Ident
    text: str = ""
    version: int
    added: int = 0
    skipped: int = 0


class ConsentGranted(_EventBase):
    type: Literal["ConsentGranted"] = "ConsentGranted"
    user: Ident


class ConsentWithdrawn(_EventBase):
    type: Literal["ConsentWithdrawn"] = "ConsentWithdrawn"
    user: Ident
    # Part of an operator's erasure of the subject, not the member's own withdrawal.
    erased: bool = False


class AgentRemoved(_EventBase):
    """The agent was soft-deleted: nothing of its memory is served, no write is accepted."""

    type: Literal["AgentRemoved"] = "AgentRemoved"


class UserRemoved(_EventBase):
    """A member left the tenant (under the workspace agent): no agent serves their memory until
    they are restored. `erased`: the user was deleted, and a `SubjectErased` follows."""

    type: Literal["UserRemoved"] = "UserRemoved"
    user: Ident
    erased: bool = True


class UserRestored(_EventBase):
    """A removed member was restored (under the workspace agent): keys may be issued to them again."""

    type: Literal["UserRestored"] = "UserRestored"
    user: Ident


class TenantRestored(_EventBase):
    """A removed tenant was restored (under its workspace agent): keys may be issued in it again."""

    type: Literal["TenantRestored"] = "TenantRestored"


class SubjectErased(_EventBase):
    """A subject's data keys are to be destroyed and every projection purges what it holds
    of it (docs/features/encryption-and-erasure.md). No personal data: the ids name the subject.

    `user` set, `agent` an agent: one member on one agent (EraseSubject). `user` set under
    the workspace agent: the member on every agent of the tenant (RemoveUser). `user` None:
    the whole agent (RemoveAgent), or with `tenant_wide` every agent of the tenant."""

    type: Literal["SubjectErased"] = "SubjectErased"
    user: Ident | None = None
    tenant_wide: bool = False


class RecordsPurged(_EventBase):
    """Retention removed these records for good (tombstones past the retention period): every
    projection drops every version of them, the ledger forgets them. Ids only."""

    type: Literal["RecordsPurged"] = "RecordsPurged"
    record_ids: list[Ident]
    user: Ident | None = None  # the subject the records belong to, when a member


class RunEntryAdded(_EventBase):
    """A write landed in a run's session memory (docs/features/session-memory.md). `record_id` names the
    durable record a write with a scope was also stored as. The counts are the run's entries not
    yet summarized after this one, so the run-compression worker needs no state of its own."""

    type: Literal["RunEntryAdded"] = "RunEntryAdded"
    run: str
    entry_id: Ident
    record_id: Ident | None = None
    summary: str = ""
    content: str = ""
    kind: str = "fact"
    user: Ident | None = None
    run_last_write: datetime  # the run's newest write so far: it expires 48 h after this
    # The run's first write, or the first after it expired: what a view kept of it goes.
    starts_run: bool = False
    pending_entries: int = 0
    pending_chars: int = 0


class RunSummarized(_EventBase):
    """A run's older entries (`entry_ids`) compressed into `summary`, which replaces the run's
    previous summary (the model read that one too)."""

    type: Literal["RunSummarized"] = "RunSummarized"
    run: str
    user: Ident | None = None  # the run's member: a run is one member's (or the agent's own)
    summary: str = ""
    entry_ids: list[Ident]
    run_last_write: datetime | None = None  # unchanged by a summary, which is no write


class UsageRecorded(_EventBase):
    """Records reached the model (`RecordUsage`): each one's `usage_count` is now `totals[id]`,
    at the same version, as usage is not content. No record snapshot: a projection keeps the
    totals beside the versions. `usage_partition`/`through_offset`: the span counted, so the
    ledger counts it once, also after a recovery."""

    type: Literal["UsageRecorded"] = "UsageRecorded"
    totals: dict[Ident, int]
    usage_partition: int
    through_offset: int


class ConventionProposed(_EventBase):
    """A tenant convention candidate (`ProposeConvention`), under the tenant's workspace agent:
    `entry_id` is the convention, `agents` every agent seen establishing it so far."""

    type: Literal["ConventionProposed"] = "ConventionProposed"
    entry_id: str
    text: str = ""
    agents: list[Ident]


class ConventionApproved(_EventBase):
    """A tenant administrator approved the convention: in every recall of the tenant's agents."""

    type: Literal["ConventionApproved"] = "ConventionApproved"
    entry_id: str


class ConventionRejected(_EventBase):
    type: Literal["ConventionRejected"] = "ConventionRejected"
    entry_id: str


class TenantFloorSet(_EventBase):
    """`chars`: what the floor takes of every recall (the ledger keeps the layer within its budget)."""

    type: Literal["TenantFloorSet"] = "TenantFloorSet"
    entry_id: str
    text: str = ""
    chars: int = 0


class TenantFloorRemoved(_EventBase):
    type: Literal["TenantFloorRemoved"] = "TenantFloorRemoved"
    entry_id: str


class PlatformEntrySet(_EventBase):
    """A platform entry (`kind` policy or default), under the platform's pseudo tenant."""

    type: Literal["PlatformEntrySet"] = "PlatformEntrySet"
    entry_id: str
    kind: Literal["policy", "default"]
    text: str = ""
    chars: int = 0  # what the entry takes of every recall (policies are kept within their budget)


class PlatformEntryRemoved(_EventBase):
    type: Literal["PlatformEntryRemoved"] = "PlatformEntryRemoved"
    entry_id: str


class NoteSaved(_EventBase):
    """A note of the identity (the agent, and `user` or none) at `revision` (1 when made), whole:
    its topic, summary and sources (docs/features/notes.md). `session`: the session it was saved from."""

    type: Literal["NoteSaved"] = "NoteSaved"
    note_id: str
    user: Ident | None = None
    revision: int
    topic: str = ""
    summary: str = ""
    sources: list[NoteSource]
    session: str | None = None


class NoteForgotten(_EventBase):
    """The note was deleted at `revision` (the last it had); the messages it cited stay."""

    type: Literal["NoteForgotten"] = "NoteForgotten"
    note_id: str
    user: Ident | None = None
    revision: int


class CommandRejected(_EventBase):
    type: Literal["CommandRejected"] = "CommandRejected"
    code: str
    field: str | None = None
    reason: str


MemoryEvent = Annotated[
    RecordAdded
    | RecordSuperseded
    | RecordDeleted
    | RecordExpired
    | RecordPinned
    | RecordUnpinned
    | RecordRevised
    | RecordRestored
    | EpisodeLinked
    | WriteStaged
    | TurnResolved
    | WriteDiscarded
    | AgentConfigured
    | BlockChanged
    | ProfileChanged
    | ConsentGranted
    | ConsentWithdrawn
    | AgentRemoved
    | UserRemoved
    | UserRestored
    | TenantRestored
    | SubjectErased
    | RecordsPurged
    | RunEntryAdded
    | RunSummarized
    | UsageRecorded
    | ConventionProposed
    | ConventionApproved
    | ConventionRejected
    | TenantFloorSet
    | TenantFloorRemoved
    | PlatformEntrySet
    | PlatformEntryRemoved
    | NoteSaved
    | NoteForgotten
    | CommandRejected,
    Field(discriminator="type"),
]

RECORD_EVENTS = (RecordAdded, RecordSuperseded, RecordDeleted, RecordExpired, RecordPinned, RecordUnpinned,
                 RecordRevised, RecordRestored, EpisodeLinked)
