"""Commands on `memlane.memory.commands`, keyed by tenant/agent: the ledger's input (`Command`).

What every command carries is `command_base`; the consent, erasure, removal and restore
commands are `commands_subject`, importable from here as every other command is."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from events.base import RUN_ID_PATTERN, AppId, Ident, Message_, RunId
from events.command_base import CommandBase

# The consent, erasure, removal and restore commands, in `Command` below and importable from here.
from events.commands_subject import (
    EraseSubject,
    GrantConsent,
    RemoveAgent,
    RemoveTenant,
    RemoveUser,
    RestoreTenant,
    RestoreUser,
    WithdrawConsent,
)
from events.config import AgentConfig
from events.limits import check_labels, check_metadata, check_one_line, check_tags, unless_stored
from events.record import Content, Scope, Status, Summary

# Limited on commands, where a write enters, and not on records: events already in the
# log keep decoding whatever they hold, and so does a staged write decoded as stored
# (the turn a write waits for: `command_base.TurnRef`).
Metadata = Annotated[dict[str, Any], AfterValidator(unless_stored(check_metadata))]
Labels = Annotated[dict[str, str], AfterValidator(unless_stored(check_labels))]
Tags = Annotated[list[str], AfterValidator(unless_stored(check_tags))]
OneLine = AfterValidator(unless_stored(check_one_line))
# A time in the world; one without a zone is UTC.
WorldTime = Annotated[datetime, AfterValidator(lambda t: t if t.tzinfo else t.replace(tzinfo=UTC))]
# The version the writer read of the record it changes (docs/features/trust.md): the ledger refuses the
# write with VERSION_CONFLICT when the record has moved on since. None: no check.
ExpectedVersion = Annotated[int, Field(ge=0)] | None


def _valid_to(cls: Any, v: datetime | None, info: ValidationInfo) -> datetime | None:
    start = info.data.get("valid_from")
    if v is not None and start is not None and v < start:
        raise ValueError(f"valid_to ({v.isoformat()}) is before valid_from ({start.isoformat()}): a fact "
                         "holds from valid_from until valid_to")
    return v


class WorldTimes(BaseModel):
    """A write's world time, checked apart from the write (a model's candidate)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    observed_at: WorldTime | None = None
    valid_from: WorldTime | None = None
    valid_to: WorldTime | None = None
    _valid_interval = field_validator("valid_to")(_valid_to)


class MergeEvidence(Message_):
    """Why a write is taken for a near duplicate of `record_id` (events.rules.near_duplicate):
    measured by the API (the similarity needs the embedder), re-checked by the ledger, and kept
    on the event that records the merge, so a replay decides the same. Ids and numbers only."""

    record_id: Ident
    similarity: Annotated[float, Field(ge=-1, le=1)]
    overlap: Annotated[float, Field(ge=0, le=1)]
    age_s: Annotated[float, Field(ge=0)]


class AddMemory(CommandBase):
    type: Literal["AddMemory"] = "AddMemory"
    record_id: Ident | None = None
    summary: Annotated[Summary, OneLine]
    content: Content = ""
    kind: Annotated[str, Field(min_length=1, max_length=64)] = "fact"
    labels: Labels = {}
    tags: Tags = []
    classification: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    scope: Scope | None = None
    session: Ident | None = None
    pinned: bool = False
    replaces: Ident | None = None
    key: Annotated[str, Field(max_length=256)] | None = None
    confidence: Annotated[float, Field(ge=0, le=1)] | None = None
    importance: Annotated[float, Field(ge=0, le=1)] | None = None  # None: the record's default
    # With `replaces`, the replaced record's version; without, only 0: the write must make a
    # new record, not merge into a live one that states the same (docs/features/trust.md).
    expected_version: ExpectedVersion = None
    # Another write of the same review gives this key a different text: the
    # record is PENDING, or CONFLICT when a stored fact holds the key.
    pending: bool = False
    # The review says this fact disagrees with the stored record of this id and cannot tell
    # which is right: the record is CONFLICT while that one is live.
    contradicts: Ident | None = None
    expires_at: datetime | None = None
    metadata: Metadata = {}
    # World time: when it was observed, and from when until when it held (each kept on every
    # version); left out, observed and valid from when it was written, with no end.
    observed_at: WorldTime | None = None
    valid_from: WorldTime | None = None
    valid_to: WorldTime | None = None
    # The run (session memory) the write belongs to: with no `scope` it is a run entry only,
    # with one it is also stored durably at once (docs/features/session-memory.md).
    run: RunId | None = None
    # The API found a near duplicate of this write: the ledger merges it there if its own
    # re-check agrees, else adds the record as usual (docs/features/near-duplicate-merge.md).
    merge: MergeEvidence | None = None

    _valid_interval = field_validator("valid_to")(_valid_to)


class DeleteMemory(CommandBase):
    type: Literal["DeleteMemory"] = "DeleteMemory"
    record_id: Ident
    session: Ident | None = None
    expected_version: ExpectedVersion = None


class PinMemory(CommandBase):
    type: Literal["PinMemory"] = "PinMemory"
    record_id: Ident
    session: Ident | None = None
    expected_version: ExpectedVersion = None


class UnpinMemory(CommandBase):
    type: Literal["UnpinMemory"] = "UnpinMemory"
    record_id: Ident
    session: Ident | None = None
    expected_version: ExpectedVersion = None


class EditMemory(CommandBase):
    """An operator's edit. Different text makes a successor that replaces the
    record; the same text changes nothing, so a PENDING or CONFLICT record stays so."""

    type: Literal["EditMemory"] = "EditMemory"
    record_id: Ident
    summary: Annotated[Summary | None, OneLine] = None
    content: Content | None = None
    metadata: Metadata | None = None
    expected_version: ExpectedVersion = None


class SweepExpired(CommandBase):
    """Tombstones those of `record_ids` that are live and expired at `issued_at`. The ids
    come from the projection's expiry index; the ledger checks each one itself."""

    type: Literal["SweepExpired"] = "SweepExpired"
    record_ids: Annotated[list[Ident], Field(min_length=1, max_length=1000)]


class ExpireTurns(CommandBase):
    """Sent by the ledger to itself for an agent with a turn whose writes have waited past
    the turn timeout at `issued_at`: the ledger discards them as on any of the agent's
    commands. Without it, an agent that went quiet kept such a turn open (and its writes
    pending) until its next command."""

    type: Literal["ExpireTurns"] = "ExpireTurns"


class TurnOutcome(CommandBase):
    """Forwarded by the extraction worker so the ledger never reads `memlane.turns`."""

    type: Literal["TurnOutcome"] = "TurnOutcome"
    committed: bool
    reason: str = ""


class ReportOutcome(CommandBase):
    """How applying a procedure went: a success strengthens it, a failure weakens it."""

    type: Literal["ReportOutcome"] = "ReportOutcome"
    record_id: Ident
    success: bool
    session: Ident | None = None
    expected_version: ExpectedVersion = None


class RecordUsage(CommandBase):
    """The trust worker's count of how often records reached the model (`Retrieved` on
    `memlane.usage`, offsets `from_offset`..`through_offset` of partition `usage_partition`):
    record id -> times. The ledger counts a span once (`events.rules.ledger.usage`)."""

    type: Literal["RecordUsage"] = "RecordUsage"
    counts: Annotated[dict[Ident, Annotated[int, Field(ge=1)]], Field(min_length=1, max_length=1000)]
    usage_partition: Annotated[int, Field(ge=0)]
    from_offset: Annotated[int, Field(ge=0)]
    through_offset: Annotated[int, Field(ge=0)]


BLOCK_CHARS = 2000  # a memory block holds at most this many characters
# The agent id under which a tenant's workspace-wide blocks live (agent scope "*").
# No key is issued for it.
WORKSPACE = "@workspace"
BlockLabel = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_\-]*$")]
BlockLine = Annotated[str, Field(min_length=1, max_length=BLOCK_CHARS, pattern=r"^[^\r\n]+$")]


def block_field(label: str, application: str | None = None) -> str:
    """Where a block is kept among its agent's (the ledger's state, the views): its label, or
    `<application>:<label>` for an application-scoped one. No label or application holds ":",
    so the two never collide (docs/features/recall.md, "Application blocks")."""
    return f"{application}:{label}" if application else label


def block_of_field(field: str) -> tuple[str | None, str]:
    """(application or None, label) of a `block_field`."""
    app, sep, label = field.rpartition(":")
    return (app or None, label) if sep else (None, field)


class CurateBlock(CommandBase):
    """Memory blocks: small labeled texts at the top of every recall, kept line
    by line. `add` appends `line`; `replace` puts `line` in place of the line `old`;
    `remove` takes out the line `old`."""

    type: Literal["CurateBlock"] = "CurateBlock"
    label: BlockLabel
    action: Literal["add", "replace", "remove"]
    # Validated even when left out, so a missing line is refused under its own name.
    line: BlockLine | None = Field(None, validate_default=True)
    old: BlockLine | None = Field(None, validate_default=True)
    # The application the block is scoped to; None: the agent's (or workspace's) own.
    application: AppId | None = None

    @field_validator("line", "old")
    @classmethod
    def _needed(cls, v: str | None, info: ValidationInfo) -> str | None:
        action = info.data.get("action")
        needs = {"line": ("add", "replace"), "old": ("replace", "remove")}[info.field_name]
        if v is None and action in needs:
            what = "the line to write" if info.field_name == "line" else "the line to change, as the block holds it now"
            raise ValueError(f"{action} needs {what}")
        return v


# A member's profile on an agent (docs/features/profiles.md): one document, at most this many characters.
PROFILE_CHARS = 4000
ProfileText = Annotated[str, Field(min_length=1, max_length=PROFILE_CHARS)]
ProfileLine = Annotated[str, Field(min_length=1, max_length=500, pattern=r"^[^\r\n]+$")]


class SetProfile(CommandBase):
    """The member's (`user`) profile document on the agent becomes `text`, whole. With
    `expected_version`, only if the profile is at that version now (0: there is none yet)."""

    type: Literal["SetProfile"] = "SetProfile"
    text: ProfileText
    expected_version: ExpectedVersion = None


class DeleteProfile(CommandBase):
    """The member's profile on the agent is removed (`ProfileChanged` with no text)."""

    type: Literal["DeleteProfile"] = "DeleteProfile"
    expected_version: ExpectedVersion = None


class EnrichProfile(CommandBase):
    """Consolidation's preference facts about the member (`memory.profiles.enrich`): each line
    not in the profile yet is appended while the profile stays within `PROFILE_CHARS`."""

    type: Literal["EnrichProfile"] = "EnrichProfile"
    lines: Annotated[list[ProfileLine], Field(min_length=1, max_length=10)]


class PurgeRecords(CommandBase):
    """Retention (`events.rules.ledger.retention`, sent by the ledger to itself each night):
    superseded rows past the retention period become tombstones, and tombstones deleted at least
    the retention period before `issued_at` are removed for good; the ledger checks each id."""

    type: Literal["PurgeRecords"] = "PurgeRecords"
    record_ids: Annotated[list[Ident], Field(min_length=1, max_length=1000)]


class UndoChange(BaseModel):
    """One record an undo puts back: at `expected_version` now (else the undo is refused: the
    record moved on since it was planned), it gets a new version with the status, pin and expiry
    it had before the undone writes (status DELETED: the undone writes made it)."""

    model_config = ConfigDict(extra="forbid")
    record_id: Ident
    expected_version: Annotated[int, Field(ge=1)]
    status: Status
    pinned: bool = False
    expires_at: datetime | None = None
    valid_to: datetime | None = None


class UndoWrites(CommandBase):
    """An operator's undo of what a command, a turn or a session wrote (`events.rules.undo`
    plans it from the records' versions; the ledger checks each record is where the plan saw it).
    Itself a command whose writes an undo can take back."""

    type: Literal["UndoWrites"] = "UndoWrites"
    target: Literal["command", "turn", "session"]
    ref: Annotated[str, Field(min_length=1, max_length=256)]
    changes: Annotated[list[UndoChange], Field(max_length=1000)]


class SummarizeRun(CommandBase):
    """The run-compression worker's summary of a run's older entries (`events.rules.runs`):
    `summary` takes the place of the run's summary, and `entry_ids` leave its entries."""

    type: Literal["SummarizeRun"] = "SummarizeRun"
    run: RunId
    entry_ids: Annotated[list[Ident], Field(min_length=1, max_length=1000)]
    summary: Annotated[str, Field(min_length=1, max_length=8000)]


class ConfigureAgent(CommandBase):
    type: Literal["ConfigureAgent"] = "ConfigureAgent"
    config: AgentConfig


# Tenant and platform memory (docs/features/tenant-platform-memory.md). A tenant's conventions and floors
# live under its workspace agent (`WORKSPACE`); platform entries under the platform's own
# pseudo tenant, which no key is issued for (services/http/routes/keys.py refuses the name).
PLATFORM = "@platform"
SHARED_TEXT_CHARS = 500  # a floor's, a platform entry's or a convention's text
ENTRY_ID_CHARS = 64  # a convention's, a floor's or a platform entry's id
EntryId = Annotated[str, Field(min_length=1, max_length=ENTRY_ID_CHARS, pattern=RUN_ID_PATTERN)]
SharedText = Annotated[str, Field(min_length=1, max_length=SHARED_TEXT_CHARS)]


class ProposeConvention(CommandBase):
    """The conventions worker saw the same fact established in two or more of the tenant's
    agents (`agents`): a candidate for a tenant administrator. `convention` is the fact's key
    (`events.rules.conventions.fact_key`), so one fact is one convention however often seen."""

    type: Literal["ProposeConvention"] = "ProposeConvention"
    convention: EntryId
    text: SharedText
    agents: Annotated[list[Ident], Field(min_length=2, max_length=1000)]


class DecideConvention(CommandBase):
    """A tenant administrator approves or rejects a convention (a candidate, or one decided before)."""

    type: Literal["DecideConvention"] = "DecideConvention"
    convention: EntryId
    decision: Literal["approve", "reject"]


class SetTenantFloor(CommandBase):
    """A non-negotiable tenant policy, in every recall of the tenant's agents; set again, replaced."""

    type: Literal["SetTenantFloor"] = "SetTenantFloor"
    floor: EntryId
    text: SharedText


class RemoveTenantFloor(CommandBase):
    type: Literal["RemoveTenantFloor"] = "RemoveTenantFloor"
    floor: EntryId


class SetPlatformEntry(CommandBase):
    """The platform operator's memory for every tenant: a `policy` (non-negotiable, right after
    blocks) or a `default` (an overridable convention, last)."""

    type: Literal["SetPlatformEntry"] = "SetPlatformEntry"
    entry: EntryId
    kind: Literal["policy", "default"]
    text: SharedText


class RemovePlatformEntry(CommandBase):
    type: Literal["RemovePlatformEntry"] = "RemovePlatformEntry"
    entry: EntryId


# Notes (docs/features/notes.md): written by the agent itself, each citing 1 to `NOTE_SOURCES` messages
# of its history. A note's id is the caller's, stable across revisions.
NOTE_SOURCES = 32
NoteId = Annotated[str, Field(min_length=1, max_length=128, pattern=RUN_ID_PATTERN)]
NoteTopic = Annotated[str, Field(min_length=1, max_length=200)]
NoteSummary = Annotated[str, Field(min_length=1, max_length=2000)]


class NoteSource(BaseModel):
    """A message a note cites: its conversation (a session of the agent) and its id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation: Ident
    id: Ident


class SaveNote(CommandBase):
    """Creates the note `note_id` of the caller's identity (its agent, and `user` or none) with
    `expected_revision` 0, or updates it when `expected_revision` is its current revision. The API
    has checked that the caller can see every source; the ledger checks the revision."""

    type: Literal["SaveNote"] = "SaveNote"
    note_id: NoteId
    topic: NoteTopic
    summary: NoteSummary
    sources: Annotated[list[NoteSource], Field(min_length=1, max_length=NOTE_SOURCES)]
    expected_revision: Annotated[int, Field(ge=0)]
    session: Ident | None = None  # the session the note was saved from: its own sources' conversation

    @field_validator("topic", "summary")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("it is blank; write what the note is about")
        return v


class ForgetNote(CommandBase):
    """Deletes the note `note_id` of the caller's identity; the messages it cites stay. With
    `expected_revision`, only if the note is at that revision."""

    type: Literal["ForgetNote"] = "ForgetNote"
    note_id: NoteId
    expected_revision: Annotated[int, Field(ge=1)] | None = None


Command = Annotated[
    AddMemory | DeleteMemory | PinMemory | UnpinMemory | EditMemory | SweepExpired | ExpireTurns | TurnOutcome
    | ConfigureAgent | CurateBlock | ReportOutcome | GrantConsent | WithdrawConsent | EraseSubject | RemoveAgent
    | RemoveUser | RemoveTenant | RestoreUser | RestoreTenant | PurgeRecords | RecordUsage | SummarizeRun | SetProfile | DeleteProfile | EnrichProfile
    | ProposeConvention | DecideConvention | SetTenantFloor | RemoveTenantFloor | SetPlatformEntry | RemovePlatformEntry
    | SaveNote | ForgetNote | UndoWrites,
    Field(discriminator="type"),
]
