"""The ledger's subject rules, pure: the subject a record is counted and kept unique under,
who may address a member's record, and the consent and removals the ledger folds.

A subject is tenant + user + agent. A USER record is its member's: the live-fact
cap, the pinned budget and the uniqueness of a fact hold per subject (`tenant/agent|u:<user>`),
and only that member's commands address it. Records of the other scopes keep the agent-wide
keys, so an agent configured as before behaves as before.

The ledger's other modules (`events.rules.ledger`) build on this one (its commands, its
`LedgerState`); nothing here imports them, but for the type checker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from events.commands import (
    AddMemory,
    CurateBlock,
    DeleteMemory,
    DeleteProfile,
    EditMemory,
    EraseSubject,
    ExpireTurns,
    GrantConsent,
    PinMemory,
    RemoveAgent,
    ReportOutcome,
    SetProfile,
    SweepExpired,
    TurnOutcome,
    UnpinMemory,
    WithdrawConsent,
)
from events.config import AgentConfig
from events.errors import ErrorCode
from events.lean import LeanRecord
from events.record import LIVE, MemoryRecord, Scope, Source
from events.rules.subjects import SubjectState, consent_needed, refusal

if TYPE_CHECKING:
    from events.rules.ledger.state import LedgerState

Record = MemoryRecord | LeanRecord


def subject_key(ak: str, user: str) -> str:
    """`tenant/agent|u:<user>`: a member's counts, consent and records on one agent."""
    return f"{ak}|u:{user}"


def count_key(ak: str, r: Record) -> str:
    """Where a record's live facts and pinned characters are counted: its subject for a
    USER record, the agent for the others."""
    return subject_key(ak, r.user) if r.scope is Scope.USER else ak


def _reach(r: Record) -> str:
    """Who besides the scope narrows it: the session of a SESSION record, the member of a USER one."""
    if r.scope is Scope.SESSION:
        return r.session or ""
    if r.scope is Scope.USER:
        return r.user or ""
    return ""


def _part(text: str) -> str:
    """A variable part of an index key, length-prefixed: session ids, user ids, kinds and keys
    may hold ':', and joined bare, two different records could give one key (a member's keyed
    fact would then conflict with another member's)."""
    return f"{len(text)}.{text}"


def slot(scope: Scope, reach: str, preview: bool) -> str:
    """Who sees a record, as an index key part: its scope, its session or member, preview or live."""
    return f"{scope.value}:{_part(reach)}:{int(preview)}"


def dup_scope(r: Record) -> str:
    """Who sees a record (`slot`). Restatements merge, and keys conflict, only among records
    one turn could see together."""
    return slot(r.scope, _reach(r), r.preview)


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def key_entry(where: str, kind: str, key: str) -> str:
    """The uniqueness index's key part for a keyed fact of `kind` seen in `where` (a `slot`).
    The record's key is hashed: it is personal (snapshots seal the index besides)."""
    return f"{where}:{_part(kind)}:{_key_digest(key)}"


def text_entry(r: Record, text_hash: str) -> str:
    """The uniqueness index's key part for a live fact: one per subject (its `slot`), kind, key
    and content hash, so the same words of another kind, or under another key, are another fact."""
    return f"{dup_scope(r)}:{_part(r.kind)}:{_key_digest(r.key) if r.key else '-'}:{text_hash}"


def key_slots_seen(r: Record) -> list[str]:
    """The slots whose keyed facts a turn writing `r` sees: its own; the agent scope and
    the writing member's for a session record; the writing session's for an agent or a
    user record; and for a preview record, the live ones too."""
    scopes = [(r.scope, _reach(r))]
    if r.scope is Scope.SESSION:
        scopes.append((Scope.AGENT, ""))
        if r.user:
            scopes.append((Scope.USER, r.user))
    elif r.session:  # an agent- or user-scope write is seen with the session it was written in
        scopes.append((Scope.SESSION, r.session))
    previews = (True, False) if r.preview else (False,)
    return [slot(scope, reach, p) for p in previews for scope, reach in scopes]


def may_address(r: MemoryRecord, cmd: Any) -> bool:
    """A USER record is addressed only by its member's commands, and never by an operator's:
    an operator neither reads, edits, pins nor deletes a member's fact. Erasing a member's
    memory is `EraseSubject`, which tombstones the subject's records without addressing them
    one by one. A member's key reaches its own USER records and no other record."""
    source = cmd.provenance.source
    if r.scope is Scope.USER:
        if source is Source.OPERATOR:
            return False
        return r.user is not None and r.user == cmd.user
    return source is not Source.MEMBER


def consent_of(state: LedgerState, ak: str, user: str | None) -> Literal["granted", "withdrawn"] | None:
    """The subject's consent as `events.rules.subjects.SubjectState` names it."""
    given = state.consent.get(subject_key(ak, user)) if user else None
    return None if given is None else "granted" if given else "withdrawn"


class Refused(NamedTuple):
    """Why the ledger refuses a command: `Rejected`'s arguments."""

    code: ErrorCode
    field: str | None
    reason: str


# What a removed agent still takes: what only deletes, expires or resolves what is there, and
# a removal or a withdrawal said again.
AFTER_REMOVAL = frozenset({SweepExpired, ExpireTurns, TurnOutcome, EraseSubject, DeleteMemory, RemoveAgent,
                           WithdrawConsent})
# What a member's key asks of the ledger: its own facts' edits and deletes, its profile, and its consent.
MEMBER_COMMANDS = frozenset({EditMemory, DeleteMemory, GrantConsent, WithdrawConsent, SetProfile, DeleteProfile})
# The writes that need the subject's consent when the agent requires it; an edit needs it
# only for new text, which the ledger asks when it makes the successor. A delete needs it
# too unless the member or an operator gives it (`needs_consent`): withdrawal deletes
# nothing, and nothing, not even a review's or a tool's delete, is written after it.
CONSENTED = frozenset({AddMemory, PinMemory, UnpinMemory, ReportOutcome, CurateBlock})
# The memory writes an operator never gives naming a member: an operator never writes a
# member's memory (nor grants for them). Withdrawing, erasing and removing a member name
# them, and configuration, removal of an agent and a turn's commands write no member's memory.
NOT_FOR_A_MEMBER = frozenset({AddMemory, EditMemory, DeleteMemory, PinMemory, UnpinMemory, ReportOutcome,
                              CurateBlock, SweepExpired, GrantConsent})


def needs_consent(cmd: Any) -> bool:
    """Whether `cmd` is a write its subject's consent must allow (`CONSENTED`, and deletes
    but a member's own and an operator's)."""
    kind = type(cmd)
    if kind is DeleteMemory:
        return cmd.provenance.source not in (Source.MEMBER, Source.OPERATOR)
    return kind in CONSENTED


def admission(state: LedgerState, ak: str, cmd: Any, cfg: AgentConfig) -> Refused | None:
    """Why `cmd` may not be given now: its agent was removed, a member's key asks for more
    than its own facts and consent, an operator's write names a member, or the write's
    subject has no consent (or had none when the write was made)."""
    kind = type(cmd)
    source = cmd.provenance.source
    if state.removed_agents.get(ak) and kind not in AFTER_REMOVAL:
        return Refused(ErrorCode.SUBJECT_REMOVED, "agent", "this agent was removed; it takes no more writes")
    if source is Source.MEMBER and kind not in MEMBER_COMMANDS:
        return Refused(ErrorCode.FORBIDDEN, None,
                       "a member edits and deletes their own facts, writes their own profile and grants or "
                       "withdraws consent; nothing else")
    if kind is GrantConsent and source is not Source.MEMBER:
        # Consent is the member's own act: not the agent's, a review's or an operator's.
        return Refused(ErrorCode.FORBIDDEN, "user", "only the member grants consent, with their own key")
    names_a_member = cmd.user is not None or getattr(cmd, "scope", None) is Scope.USER
    if source is Source.OPERATOR and kind in NOT_FOR_A_MEMBER and names_a_member:
        return Refused(ErrorCode.FORBIDDEN, "user", "an operator never writes a member's memory")
    return consent_refusal(state, ak, cmd, cfg) if needs_consent(cmd) else None


def consent_refusal(state: LedgerState, ak: str, cmd: Any, cfg: AgentConfig) -> Refused | None:
    """The one subject rule every entry point asks (`events.rules.subjects.refusal`), with the
    consent the ledger folded, and asked as of when the write was made (its `issued_at`), not
    when it is applied: a write made before the member's memory was erased, or (when the agent
    requires consent) before the grant now in force, is refused however late it arrives (a
    lagging review, a retry, a write staged on a turn). An operator's write is not a member's,
    and needs none."""
    if cmd.provenance.source is Source.OPERATOR:
        return None
    key = subject_key(ak, cmd.user) if cmd.user else None
    erased = state.erased_at.get(key) if key else None
    if erased is not None and cmd.issued_at < erased:
        return Refused(ErrorCode.SUBJECT_REMOVED, "user",
                       f"this write was made before the member's memory was erased (at {erased.isoformat()})")
    why = refusal(cfg, cmd.user, None, SubjectState(consent=consent_of(state, ak, cmd.user)))
    if why:
        return Refused(why.code, why.field, why.reason)
    granted = state.granted_at.get(key) if key else None
    if consent_needed(cfg) and granted is not None and cmd.issued_at < granted:
        return Refused(ErrorCode.CONSENT_REQUIRED, "user",
                       f"this write was made before the member's consent at {granted.isoformat()}; "
                       "only writes made since then are kept")
    return None


def track(state: LedgerState, ak: str, r: Record) -> None:
    """Keeps each subject's live USER record ids, so an erasure reads its subject's records
    and no others. The tuple is replaced, never mutated: a scratch state shares it."""
    if r.scope is not Scope.USER or r.user is None:
        return
    key = subject_key(ak, r.user)
    held = state.subject_records.get(key) or ()
    live = r.status in LIVE
    if live == (r.id in held):
        return
    state.subject_records[key] = (*held, r.id) if live else tuple(rid for rid in held if rid != r.id)


# --------------------------------------------------------------------------- folds
# Each reads `user` of a contract event or of its `LedgerView`, which carry it alike.


def _consent_granted(state: LedgerState, ak: str, event: Any) -> None:
    key = subject_key(ak, event.user)
    state.consent[key] = True
    state.granted_at[key] = event.occurred_at  # writes made before it are not this grant's


def _consent_withdrawn(state: LedgerState, ak: str, event: Any) -> None:
    key = subject_key(ak, event.user)
    state.consent[key] = False
    if event.erased:
        state.erased_at[key] = event.occurred_at  # writes made before it are of erased memory


def _agent_removed(state: LedgerState, ak: str, event: Any) -> None:
    state.removed_agents[ak] = True


def _user_removed(state: LedgerState, ak: str, event: Any) -> None:
    # Sent under the tenant's workspace agent: `ak` is `tenant/@workspace`. Kept for audit
    # only (`LedgerState.removed_users`).
    state.removed_users[subject_key(ak, event.user)] = True


def _user_restored(state: LedgerState, ak: str, event: Any) -> None:
    state.removed_users.pop(subject_key(ak, event.user), None)


FOLDS: dict[str, Callable[[LedgerState, str, Any], None]] = {
    "ConsentGranted": _consent_granted,
    "ConsentWithdrawn": _consent_withdrawn,
    "AgentRemoved": _agent_removed,
    "UserRemoved": _user_removed,
    "UserRestored": _user_restored,
}
