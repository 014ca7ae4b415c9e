"""The ledger's state and what every rule reads of it: the constants, `LedgerState`, the
ids derived from a command, an agent's configuration, a record's current version, the
events a rule builds from its command (`event_base`, `rejected_event`), and the scratch copy
(`scratch_state`) a turn's writes are applied to before `evolve` folds them for real.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from events.base import command_key
from events.config import AgentConfig
from events.errors import ErrorCode
from events.ids import uuid5
from events.memory import CommandRejected
from events.record import MemoryRecord, Scope

NAMESPACE = uuid.UUID("5b0c2f57-3c2e-4a43-9d63-0f1d8f3a9a11")
MAX_EXPIRY = timedelta(days=180)  # the longest a member's fact lives by default (`MemoryConfig.member_fact_days`)
LIVE_FACT_CAP = 200
RESERVED_KINDS = ("episode", "procedure")  # written by consolidation only (events.rules.consolidation)
MAX_BLOCKS = 10  # labels per agent: blocks come with every recall, so they stay few
MAX_APPLICATIONS = 10  # applications with blocks of their own, per agent: each adds up to MAX_BLOCKS
# How long a turn's staged writes wait for its outcome; the default of `decide` and `overdue`,
# whose caller (the ledger worker) passes the configured one.
TURN_TIMEOUT = timedelta(minutes=10)
# How long, in event time, a resolved turn's outcome is remembered: at least this, at most
# twice. A write or an outcome that names an older turn is treated as if the turn were
# open (it waits the turn timeout, then is discarded). Kept forever, the outcomes grew by one
# entry per turn for the life of the ledger.
TURN_MEMORY = timedelta(days=1)


@dataclass
class LedgerState:
    # agent/rid -> the record's current version as JSON, parsed when a rule reads it: a
    # parsed MemoryRecord held 5.3 kB of memory against 0.9 kB for its JSON, and the ledger
    # keeps every record it ever made (tombstones and superseded versions too).
    records: MutableMapping[str, bytes] = field(default_factory=dict)
    index: MutableMapping[str, str] = field(default_factory=dict)  # agent|text:h / agent|key:k -> rid
    staged: MutableMapping[str, list] = field(default_factory=dict)  # agent|turn_ref -> [command dicts]
    # agent -> {its staged key: when the turn's first write was issued}; replaced, never mutated
    open_turns: MutableMapping[str, Mapping[str, datetime]] = field(default_factory=dict)
    turns: MutableMapping[str, str] = field(default_factory=dict)  # agent|turn_ref -> outcome, this window
    turns_before: Mapping[str, str] = field(default_factory=dict)  # the same, the window before
    turns_since: datetime | None = None  # event time the current window of `turns` began
    configs: MutableMapping[str, AgentConfig] = field(default_factory=dict)  # agent -> config (frozen)
    blocks: MutableMapping[str, Mapping[str, str]] = field(default_factory=dict)  # agent -> {label: text}; replaced
    # agent, or agent|u:user for USER records (`count_key`) -> {live, pinned_chars}
    stats: MutableMapping[str, Any] = field(default_factory=dict)
    consent: MutableMapping[str, bool] = field(default_factory=dict)  # agent|u:user -> granted (else withdrawn)
    # agent|u:user -> when the grant in force was given, and when the member's memory was last
    # erased: a write made before either is refused however late it arrives (`subject_rules`).
    granted_at: MutableMapping[str, datetime] = field(default_factory=dict)
    erased_at: MutableMapping[str, datetime] = field(default_factory=dict)
    removed_agents: MutableMapping[str, bool] = field(default_factory=dict)  # agent -> True once removed
    # tenant/@workspace|u:user -> True: a member removed tenant-wide. Kept for audit (a rebuild and
    # a snapshot show who was removed, and when the log says so); no rule reads it. It is folded
    # on the workspace's partition only, which the ledger partitions of the tenant's agents do not
    # read: the read side (the record view's removal marker) and the workers' subject check are
    # what guard a removed member's memory (docs/features/subjects-and-consent.md, "Removal").
    removed_users: MutableMapping[str, bool] = field(default_factory=dict)
    # agent|u:user -> the subject's live USER record ids (`subject_rules.track`); replaced, never mutated
    subject_records: MutableMapping[str, tuple[str, ...]] = field(default_factory=dict)
    # What was erased (`erasure.erasure_key`) -> when, the last time: the ledger worker destroys
    # the keys made before then, and again after a crash (`SubjectErased`).
    erasures: MutableMapping[str, datetime] = field(default_factory=dict)
    # agent -> {run: (the run's last write, its entries not yet summarized as (entry id, chars))}:
    # session memory (`runs`); replaced, never mutated. Expired runs leave as the agent writes.
    runs: MutableMapping[str, Mapping[str, tuple[datetime, tuple[tuple[str, int], ...]]]] = field(default_factory=dict)
    # agent|usage partition -> the last `memlane.usage` offset counted (`usage.decide_record_usage`)
    usage_marks: MutableMapping[str, int] = field(default_factory=dict)
    # The note owner (`notes.owner_key`: the agent, or agent|u:user) -> {note id: (revision, when
    # saved)}: what the revision check needs, never a note's text (`notes`). Replaced, never mutated.
    notes: MutableMapping[str, Mapping[str, tuple[int, datetime]]] = field(default_factory=dict)
    # agent|u:user -> the member's profile (`profiles`): (version, text, when written); a deleted
    # profile keeps its version with empty text, so versions never repeat. Replaced, never mutated.
    profiles: MutableMapping[str, tuple[int, str, datetime]] = field(default_factory=dict)
    # tenant/@workspace (or @platform/@workspace) -> {"c:<convention>": "<status>|<agent>,...",
    # "f:<floor>": "<chars>", "p:<entry>": "<kind>|<chars>"}: tenant and platform memory (`tenant`), ids and
    # statuses only (the texts are the projections'). Replaced, never mutated.
    shared: MutableMapping[str, Mapping[str, str]] = field(default_factory=dict)


class Rejected(Exception):
    def __init__(self, code: ErrorCode, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.code, self.field, self.reason = code, field, reason


def event_id(tenant: str, agent: str, command_id: str, n: int) -> str:
    return uuid5(NAMESPACE, f"{command_key(tenant, agent, command_id)}#{n}")


def record_id_for(tenant: str, agent: str, command_id: str) -> str:
    return uuid5(NAMESPACE, f"record:{command_key(tenant, agent, command_id)}")


def agent_key(tenant: str, agent: str) -> str:
    return f"{tenant}/{agent}"


def normalized_hash(summary: str, content: str) -> str:
    """Restated facts collide here: case, punctuation and spacing do not count."""
    text = re.sub(r"[^\w]+", " ", f"{summary} {content}".lower()).strip()
    return hashlib.sha256(text.encode()).hexdigest()[:24]


DEFAULT_CONFIG = AgentConfig()  # frozen, so one instance serves every unconfigured agent


def config_of(state: LedgerState, ak: str) -> AgentConfig:
    return state.configs.get(ak) or DEFAULT_CONFIG


def outcome_of(state: LedgerState, key: str) -> str | None:
    """A resolved turn's outcome (`agent|turn_ref`), if it is still remembered."""
    return state.turns.get(key) or state.turns_before.get(key)


def get_record(state: LedgerState, ak: str, rid: str) -> MemoryRecord | None:
    raw = state.records.get(f"{ak}/{rid}")
    return MemoryRecord.model_validate_json(raw) if raw is not None else None


def event_base(cls: type, cmd: Any, **fields: Any) -> Any:
    return cls(
        event_id="pending",
        command_id=cmd.command_id,
        tenant=cmd.tenant,
        agent=cmd.agent,
        occurred_at=cmd.issued_at,
        provenance=cmd.provenance,
        **fields,
    )


def rejected_event(cmd: Any, r: Rejected) -> CommandRejected:
    return event_base(CommandRejected, cmd, code=r.code, field=r.field, reason=r.reason)


def scratch_state(state: LedgerState) -> LedgerState:
    """A copy-on-write view: reads fall through to `state`, writes stay local."""
    from collections import ChainMap

    return LedgerState(
        records=ChainMap({}, state.records),
        index=_Overlay(state.index),
        staged=ChainMap({}, state.staged),
        open_turns=ChainMap({}, state.open_turns),
        turns=ChainMap({}, state.turns),
        turns_before=state.turns_before,
        turns_since=state.turns_since,
        configs=ChainMap({}, state.configs),
        blocks=ChainMap({}, state.blocks),
        stats=ChainMap({}, state.stats),
        consent=ChainMap({}, state.consent),
        granted_at=ChainMap({}, state.granted_at),
        erased_at=ChainMap({}, state.erased_at),
        removed_agents=ChainMap({}, state.removed_agents),
        removed_users=ChainMap({}, state.removed_users),
        subject_records=ChainMap({}, state.subject_records),
        erasures=ChainMap({}, state.erasures),
        runs=ChainMap({}, state.runs),
        usage_marks=ChainMap({}, state.usage_marks),
        notes=ChainMap({}, state.notes),
        profiles=ChainMap({}, state.profiles),
        shared=ChainMap({}, state.shared),
    )


class _Overlay(dict):
    """Dict overlay that can also hide deleted keys of the base mapping."""

    def __init__(self, base: MutableMapping[str, str]) -> None:
        super().__init__()
        self._base, self._gone = base, set()

    def get(self, k, default=None):
        if k in self._gone:
            return default
        return super().get(k, self._base.get(k, default))

    def __setitem__(self, k, v):
        self._gone.discard(k)  # set again after a delete: visible again
        super().__setitem__(k, v)

    def setdefault(self, k, v):
        cur = self.get(k)
        if cur is None:
            self[k] = v
            self._gone.discard(k)
            return v
        return cur

    def __delitem__(self, k):
        self._gone.add(k)
        super().pop(k, None)


def expiry_of(cfg: AgentConfig, scope: Scope, issued_at: datetime, asked: datetime | None = None) -> datetime | None:
    """When a record written at `issued_at` in `scope` expires: the write's own expiry (`asked`),
    capped at the configuration's limit for its scope (a member's facts, or the agent's own
    memory); None: it lives until deleted."""
    days = cfg.memory.member_fact_days if scope is Scope.USER else cfg.memory.workspace_days
    latest = issued_at + timedelta(days=days) if days is not None else None
    if asked is None or latest is None:
        return asked or latest
    return min(asked, latest)
