"""The ledger's subject rules, pure: the subject a record is counted and kept unique under,
who may address a member's record, and the consent and removals the ledger folds.

A subject is tenant + user + agent (seed 004). A USER record is its member's: the live-fact
cap, the pinned budget and the uniqueness of a fact hold per subject (`tenant/agent|u:<user>`),
and only that member's commands address it. Records of the other scopes keep the agent-wide
keys, so an agent configured as before behaves as before.

`events.rules.ledger` builds on this module (its commands, its `LedgerState`); nothing here
imports it, so either can be imported first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from events.commands import (
    AddMemory,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    EraseSubject,
    ExpireTurns,
    GrantConsent,
    PinMemory,
    RemoveAgent,
    ReportOutcome,
    SweepExpired,
    TurnOutcome,
    UnpinMemory,
    WithdrawConsent,
)
from events.config import AgentConfig
from events.errors import ErrorCode
from events.lean import LeanRecord
from events.record import LIVE, MemoryRecord, Scope, Source
from events.rules.subjects import SubjectState, refusal

if TYPE_CHECKING:
    from events.rules.ledger import LedgerState

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


def dup_scope(r: Record) -> str:
    """Who sees a record: its scope, its session or member, and preview or live.
    Restatements merge, and keys conflict, only among records one turn could see together."""
    return f"{r.scope.value}:{_reach(r)}:{int(r.preview)}"


def key_slots_seen(r: Record) -> list[str]:
    """The scopes whose keyed facts a turn writing `r` sees: its own; the agent scope and
    the writing member's for a session record; the writing session's for an agent or a
    user record; and for a preview record, the live ones too."""
    scopes = [f"{r.scope.value}:{_reach(r)}"]
    if r.scope is Scope.SESSION:
        scopes.append(f"{Scope.AGENT.value}:")
        if r.user:
            scopes.append(f"{Scope.USER.value}:{r.user}")
    elif r.session:  # an agent- or user-scope write is seen with the session it was written in
        scopes.append(f"{Scope.SESSION.value}:{r.session}")
    previews = (1, 0) if r.preview else (0,)
    return [f"{scope}:{p}" for p in previews for scope in scopes]


def may_address(r: MemoryRecord, cmd: Any) -> bool:
    """A USER record is addressed only by its member's commands. An operator may delete one
    (an erasure) and nothing more: a member's fact is edited by its member, and an operator
    never reads it. A member's key reaches its own USER records and no other record."""
    source = cmd.provenance.source
    if r.scope is Scope.USER:
        if source is Source.OPERATOR:
            return isinstance(cmd, DeleteMemory)
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
# What a member's key asks of the ledger: its own facts' edits and deletes, and its consent.
MEMBER_COMMANDS = frozenset({EditMemory, DeleteMemory, GrantConsent, WithdrawConsent})
# The writes that need the subject's consent when the agent requires it; an edit needs it
# only for new text, which the ledger asks when it makes the successor.
CONSENTED = frozenset({AddMemory, PinMemory, UnpinMemory, ReportOutcome, CurateBlock})


def admission(state: LedgerState, ak: str, cmd: Any, cfg: AgentConfig) -> Refused | None:
    """Why `cmd` may not be given now: its agent was removed, a member's key asks for more
    than its own facts and consent, or the write's subject has no consent."""
    kind = type(cmd)
    if state.removed_agents.get(ak) and kind not in AFTER_REMOVAL:
        return Refused(ErrorCode.SUBJECT_REMOVED, "agent", "this agent was removed; it takes no more writes")
    if cmd.provenance.source is Source.MEMBER and kind not in MEMBER_COMMANDS:
        return Refused(ErrorCode.FORBIDDEN, None,
                       "a member edits and deletes their own facts and grants or withdraws consent; nothing else")
    return consent_refusal(state, ak, cmd, cfg) if kind in CONSENTED else None


def consent_refusal(state: LedgerState, ak: str, cmd: Any, cfg: AgentConfig) -> Refused | None:
    """The one subject rule every entry point asks (`events.rules.subjects.refusal`), with the
    consent the ledger folded. An operator's write is not a member's, and needs none."""
    if cmd.provenance.source is Source.OPERATOR:
        return None
    why = refusal(cfg, cmd.user, None, SubjectState(consent=consent_of(state, ak, cmd.user)))
    return Refused(why.code, why.field, why.reason) if why else None


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
    state.consent[subject_key(ak, event.user)] = True


def _consent_withdrawn(state: LedgerState, ak: str, event: Any) -> None:
    state.consent[subject_key(ak, event.user)] = False


def _agent_removed(state: LedgerState, ak: str, event: Any) -> None:
    state.removed_agents[ak] = True


def _user_removed(state: LedgerState, ak: str, event: Any) -> None:
    # Sent under the tenant's workspace agent: `ak` is `tenant/@workspace`.
    state.removed_users[subject_key(ak, event.user)] = True


FOLDS: dict[str, Callable[[LedgerState, str, Any], None]] = {
    "ConsentGranted": _consent_granted,
    "ConsentWithdrawn": _consent_withdrawn,
    "AgentRemoved": _agent_removed,
    "UserRemoved": _user_removed,
}
