"""Notes in the ledger (docs/features/notes.md), pure: `SaveNote` makes or revises a note of the caller's
identity (`NoteSaved`), `ForgetNote` deletes it (`NoteForgotten`). The ledger checks who writes
and the revision the writer read; the API checked, before sending, that the writer can see every
message the note cites (the ledger cannot: history is not in its log).

A note belongs to one identity, its owner: the agent with no member, or one member on the agent
(`owner_key`, spelled as `events.sealing.subject_of` spells subjects, so an erasure's `covers`
reaches a member's notes, and an agent's reaches all of them). The state keeps per owner each
note's revision and when it was saved, never its text.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from events.commands import ForgetNote, SaveNote
from events.errors import ErrorCode
from events.memory import NoteForgotten, NoteSaved
from events.record import Source
from events.rules.ledger.state import LedgerState, Rejected, config_of, event_base
from events.rules.ledger.subject_rules import consent_refusal, subject_key

# Notes per identity: recall ranks all of an identity's notes on every turn, so they stay few.
MAX_NOTES = 200


def owner_key(ak: str, user: str | None) -> str:
    """Whose a note is: the member's on the agent (`tenant/agent|u:<user>`), else the agent's."""
    return subject_key(ak, user) if user else ak


def revision_of(state: LedgerState, ak: str, user: str | None, note_id: str) -> int:
    """The note's current revision; 0 when there is none (never made, or forgotten)."""
    held = (state.notes.get(owner_key(ak, user)) or {}).get(note_id)
    return held[0] if held else 0


def _check_writer(state: LedgerState, ak: str, cmd: Any) -> None:
    """Notes are the agent's own: written by its tool calls (an agent's key), in a live turn, with
    memory on and, for a member's notes, the member's consent where the agent needs it."""
    cfg = config_of(state, ak)
    if not cfg.memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.provenance.source is not Source.TOOL:
        raise Rejected(ErrorCode.FORBIDDEN, None, "notes are written by the agent itself, with its own key; "
                       "an operator removes them only by erasing their member or removing the agent")
    if cmd.preview:
        raise Rejected(ErrorCode.PREVIEW_READ_ONLY, "note_id",
                       "notes are live memory for every turn; a preview turn cannot change them")
    why = consent_refusal(state, ak, cmd, cfg)
    if why is not None:
        raise Rejected(*why)


def _conflict(note_id: str, expected: int, current: int) -> Rejected:
    if current == 0:
        why = f"note {note_id} does not exist; save it with expected_revision 0 to make it"
    elif expected == 0:
        why = (f"note {note_id} already exists at revision {current}; pass expected_revision {current} "
               "to revise it, or choose another id")
    else:
        why = (f"expected revision {expected} but note {note_id} is at revision {current}; read it again "
               "and retry with its current revision")
    return Rejected(ErrorCode.REVISION_CONFLICT, "expected_revision", why)


def save(state: LedgerState, ak: str, cmd: SaveNote, events: list) -> None:
    """`expected_revision` 0 makes the note (revision 1); otherwise it must be the current
    revision, and the note's next revision replaces it whole."""
    _check_writer(state, ak, cmd)
    held = state.notes.get(owner_key(ak, cmd.user)) or {}
    current = revision_of(state, ak, cmd.user, cmd.note_id)
    if cmd.expected_revision != current:
        raise _conflict(cmd.note_id, cmd.expected_revision, current)
    if current == 0 and len(held) >= MAX_NOTES:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "note_id",
                       f"this identity has {len(held)} notes, the limit is {MAX_NOTES}; forget one or revise one")
    events.append(event_base(NoteSaved, cmd, note_id=cmd.note_id, user=cmd.user, revision=current + 1, topic=cmd.topic,
                        summary=cmd.summary, sources=list(cmd.sources), session=cmd.session))


def forget(state: LedgerState, ak: str, cmd: ForgetNote, events: list) -> None:
    _check_writer(state, ak, cmd)
    current = revision_of(state, ak, cmd.user, cmd.note_id)
    if current == 0:
        raise Rejected(ErrorCode.NOT_FOUND, "note_id", f"note {cmd.note_id} does not exist for this identity")
    if cmd.expected_revision is not None and cmd.expected_revision != current:
        raise _conflict(cmd.note_id, cmd.expected_revision, current)
    events.append(event_base(NoteForgotten, cmd, note_id=cmd.note_id, user=cmd.user, revision=current))


# --------------------------------------------------------------------------- folds
# Each reads `note_id`, `user`, `revision` and `occurred_at` of a contract event or its `LedgerView`.


def saved(state: LedgerState, ak: str, event: Any) -> None:
    owner = owner_key(ak, event.user)
    state.notes[owner] = {**(state.notes.get(owner) or {}), event.note_id: (event.revision, event.occurred_at)}


def forgotten(state: LedgerState, ak: str, event: Any) -> None:
    owner = owner_key(ak, event.user)
    _keep(state, owner, {k: v for k, v in (state.notes.get(owner) or {}).items() if k != event.note_id})


def _keep(state: LedgerState, owner: str, held: dict[str, tuple[int, datetime]]) -> None:
    """The owner's notes are now `held`: an owner with none leaves the state, as a fold that
    never saw its notes has no entry (a scratch state's base keeps it: it is hidden empty)."""
    if held:
        state.notes[owner] = held
    elif owner in state.notes:
        try:
            del state.notes[owner]
        except KeyError:  # a scratch state (ChainMap) that holds it in its base only
            state.notes[owner] = {}


def drop_owned(state: LedgerState, taken: Callable[[str], bool], until: datetime | None = None) -> int:
    """Drops the notes of every owner `taken` names (an erasure's `covers`); with `until`, only
    those last saved by then (a member may come back later, under new keys). Returns how many."""
    n = 0
    for owner in [o for o in state.notes if taken(o)]:
        kept = {k: v for k, v in state.notes[owner].items() if until is not None and v[1] > until}
        n += len(state.notes[owner]) - len(kept)
        _keep(state, owner, kept)
    return n


FOLDS = {"NoteSaved": saved, "NoteForgotten": forgotten}
HANDLERS = {SaveNote: save, ForgetNote: forget}
