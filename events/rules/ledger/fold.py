"""`evolve`: folds one event, a contract event or its `LedgerView` (recovery), into
`LedgerState`. Storing a record's new version moves its counts, its subject's record ids
and the uniqueness index (`_store`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from events.commands import block_field
from events.config import AgentConfig
from events.lean import RECORD_EVENT_TYPES, LeanRecord, LedgerView, decode_lean_record
from events.record import LIVE, MemoryRecord, Status
from events.rules.ledger import episodes, profiles, retention, runs, tenant
from events.rules.ledger import notes as notes_rules
from events.rules.ledger import subject_rules as subjects
from events.rules.ledger.erasure import subject_erased
from events.rules.ledger.state import RESERVED_KINDS, TURN_MEMORY, LedgerState, agent_key, normalized_hash
from events.rules.ledger.subject_rules import count_key, dup_scope, key_entry, text_entry
from events.rules.ledger.usage import usage_recorded
from events.rules.tokens import pin_line_chars


def evolve(state: LedgerState, event: Any) -> None:
    """Folds `event`: a contract event, or the `LedgerView` of one (recovery). Both carry the
    event's type name, so one table serves both; an event that changes no state has no entry."""
    fold = _FOLDS.get(event.type)
    if fold is not None:
        fold(state, agent_key(event.tenant, event.agent), event)


def _configured(state: LedgerState, ak: str, event: Any) -> None:
    lean = isinstance(event, LedgerView)
    state.configs[ak] = AgentConfig.model_validate_json(bytes(event.config_json)) if lean else event.config


def _block_changed(state: LedgerState, ak: str, event: Any) -> None:
    at = block_field(event.label, event.application)  # an application's block is kept apart
    blocks = {k: v for k, v in (state.blocks.get(ak) or {}).items() if k != at}
    if event.text:
        blocks[at] = event.text
    state.blocks[ak] = blocks


def _turn_resolved(state: LedgerState, ak: str, event: Any) -> None:
    outcome = "committed" if event.committed else "timed_out" if event.timed_out else "rolled_back"
    key = f"{ak}|{event.turn_ref}"
    if state.turns_since is None:
        state.turns_since = event.occurred_at
    elif event.occurred_at - state.turns_since >= TURN_MEMORY:
        state.turns_before, state.turns, state.turns_since = state.turns, {}, event.occurred_at
    state.turns[key] = outcome
    state.staged.pop(key, None)
    rest = {k: at for k, at in (state.open_turns.get(ak) or {}).items() if k != key}
    if rest:
        state.open_turns[ak] = rest
    else:
        state.open_turns.pop(ak, None)


def _write_staged(state: LedgerState, ak: str, event: Any) -> None:
    key = f"{ak}|{event.turn_ref}"
    state.staged[key] = [*(state.staged.get(key) or []), event.command]
    opened = state.open_turns.get(ak) or {}
    if key not in opened:  # a WriteStaged's time is its write's `issued_at`
        state.open_turns[ak] = {**opened, key: event.occurred_at}


def _record_changed(state: LedgerState, ak: str, event: Any) -> None:
    if isinstance(event, LedgerView):
        raw = bytes(event.record_json)
        _store(state, ak, decode_lean_record(raw), raw)
    else:
        _store(state, ak, event.record, event.record.model_dump_json().encode())


_FOLDS: dict[str, Callable[[LedgerState, str, Any], None]] = {
    "AgentConfigured": _configured,
    "BlockChanged": _block_changed,
    "TurnResolved": _turn_resolved,
    "WriteStaged": _write_staged,
    **dict.fromkeys(RECORD_EVENT_TYPES, _record_changed),
    **subjects.FOLDS,
    "SubjectErased": subject_erased,
    "RecordsPurged": retention._purged,
    **runs.FOLDS,
    "UsageRecorded": usage_recorded,
    **notes_rules.FOLDS,
    **profiles.FOLDS,
    **tenant.FOLDS,
}


def _counts_as_fact(r: MemoryRecord | LeanRecord) -> bool:
    """The live-fact cap counts facts only: episodes and procedures are not facts."""
    return r.status in LIVE and r.kind not in RESERVED_KINDS


def _count(state: LedgerState, key: str, live: int, pinned_chars: int) -> None:
    """Moves the live facts and pinned characters counted under `key` (`count_key`)."""
    stats = state.stats.get(key) or {"live": 0, "pinned_chars": 0}
    state.stats[key] = {"live": stats["live"] + live, "pinned_chars": stats["pinned_chars"] + pinned_chars}


def _store(state: LedgerState, ak: str, r: MemoryRecord | LeanRecord, raw: bytes) -> None:
    """`raw` is `r` as JSON, as the state keeps it."""
    key = f"{ak}/{r.id}"
    stored = state.records.get(key)
    prev = decode_lean_record(stored) if stored is not None else None
    if prev and prev.version >= r.version:
        return
    if prev:
        _count(state, count_key(ak, prev), -_counts_as_fact(prev), -(pin_line_chars(prev) if prev.pinned else 0))
    _count(state, count_key(ak, r), _counts_as_fact(r), pin_line_chars(r) if r.pinned else 0)
    subjects.track(state, ak, r)
    state.records[key] = raw
    text_key = f"{ak}|text:{text_entry(r, normalized_hash(r.summary, r.content))}"
    key_key = f"{ak}|key:{key_entry(dup_scope(r), r.kind, r.key)}" if r.key else None
    if r.kind == "episode" and r.version == 1:
        state.index[f"{ak}|episode:{dup_scope(r)}"] = r.id  # episodes come in log order: the last is the newest
    episodes.track(state, ak, r)
    if r.status in LIVE:
        state.index.setdefault(text_key, r.id)
        if key_key and r.status is Status.ACTIVE:
            state.index.setdefault(key_key, r.id)
    else:
        # Tombstones and superseded versions do not hold a uniqueness slot.
        if state.index.get(text_key) == r.id:
            del state.index[text_key]
        if key_key and state.index.get(key_key) == r.id:
            del state.index[key_key]
