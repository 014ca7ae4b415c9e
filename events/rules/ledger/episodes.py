"""A run's facts and its episode, and facts confirmed across runs (docs/features/consolidation.md).

- `track` (folded): an extraction-made record is listed under its run, its session and its
  execution, until the run's episode is added.
- `link` (decided): a new episode links those records of its run that are still live: an
  `EpisodeLinked` per record, its next version naming the episode in `provenance.episode`.
  The version goes up although the text does not: every projection is a version-guarded
  upsert of a record's snapshot, so an unversioned change would need a second fold path in
  each of them and would lose a redelivery's idempotence. The embedding is reused (same text).
- `confirmed` (decided): a restatement merged into a live record counts a confirmation
  (`events.rules.procedures.confirm`), and an approved pattern or decision confirmed often
  enough becomes a procedure, once (`procedures.promotes`).
"""

from __future__ import annotations

from typing import Any

from events.commands import AddMemory
from events.memory import EpisodeLinked, RecordAdded
from events.record import LIVE, MemoryRecord
from events.rules import procedures
from events.rules.ledger.state import LedgerState, config_of, event_base, expiry_of, get_record


def _run_keys(ak: str, session: str | None, execution_id: str | None) -> list[str]:
    return ([f"{ak}|run:s:{session}"] if session else []) + ([f"{ak}|run:x:{execution_id}"] if execution_id else [])


def track(state: LedgerState, ak: str, r: Any) -> None:
    """Lists a new extraction-made record (a `MemoryRecord` or a `LeanRecord`) under its run;
    a new episode ends its run's lists, which it has linked by then. Folded, so a replay
    and a recovery list the same."""
    if r.version != 1:
        return
    p = r.provenance
    if r.kind == "episode":
        for k in _run_keys(ak, p.session or r.session, p.execution_id):
            if state.index.get(k) is not None:
                del state.index[k]
    elif p.source == "EXTRACTION" and p.episode is None:
        for k in _run_keys(ak, p.session or r.session, p.execution_id):
            held = state.index.get(k)
            state.index[k] = f"{held} {r.id}" if held else r.id


def link(state: LedgerState, ak: str, cmd: AddMemory, episode: MemoryRecord, events: list) -> None:
    """An `EpisodeLinked` for each live record of the episode's run (`track`) that names no
    episode yet, in the order they were made."""
    p = episode.provenance
    ids: dict[str, None] = {}
    for k in _run_keys(ak, p.session or episode.session, p.execution_id):
        ids.update(dict.fromkeys((state.index.get(k) or "").split()))
    for rid in ids:
        r = get_record(state, ak, rid)
        if r is None or r.status not in LIVE or r.provenance.episode or r.preview != episode.preview:
            continue
        linked = r.model_copy(update={"version": r.version + 1, "modified": cmd.issued_at,
                                      "provenance": r.provenance.model_copy(update={"episode": episode.id})})
        events.append(event_base(EpisodeLinked, cmd, record=linked, episode=episode.id))


def confirmed(state: LedgerState, ak: str, cmd: AddMemory, existing: MemoryRecord, events: list) -> None:
    """The answer to `cmd`, which restates the live record `existing`: the record merged (a
    new version when it counts as a confirmation), and the procedure it becomes, once, when
    the confirmation makes it qualify. A near-duplicate merge calls this too."""
    merged = procedures.confirm(existing, cmd.provenance, cmd.session, cmd.confidence, cmd.issued_at)
    events.append(event_base(RecordAdded, cmd, record=merged or existing, merged=True))
    if merged is None or not procedures.promotes(merged) or get_record(state, ak, procedures.procedure_id(merged)):
        return
    proc = procedures.procedure_of(merged, cmd.issued_at, expiry_of(config_of(state, ak), merged.scope, cmd.issued_at))
    events.append(event_base(RecordAdded, cmd, record=proc))
