"""The subject commands: a member's consent granted or withdrawn, a member's memory on an
agent erased, an agent removed, a member removed tenant-wide. Who may give a command and
what consent a write needs is `subject_rules`. Each erasure and removal ends with
`SubjectErased`: the state forgets the subject (`erasure`) and the worker destroys its keys.
"""

from __future__ import annotations

from typing import Any

from events.commands import (
    WORKSPACE,
    EraseSubject,
    GrantConsent,
    RemoveAgent,
    RemoveUser,
    RestoreTenant,
    RestoreUser,
    WithdrawConsent,
)
from events.errors import ErrorCode
from events.memory import (
    AgentRemoved,
    ConsentGranted,
    ConsentWithdrawn,
    RecordDeleted,
    SubjectErased,
    TenantRestored,
    UserRemoved,
    UserRestored,
)
from events.record import Source
from events.rules.ledger.changes import tombstone_record
from events.rules.ledger.state import LedgerState, Rejected, event_base, get_record
from events.rules.ledger.subject_rules import subject_key


def _member(cmd: Any) -> str:
    """The member a subject command is about."""
    if not cmd.user:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "user", f"{cmd.type} is about a member: name the user")
    return cmd.user


def decide_consent(state: LedgerState, ak: str, cmd: GrantConsent | WithdrawConsent, events: list) -> None:
    """Written again when asked again, rather than nothing: the caller waits for an event,
    and the fold of a second grant changes nothing."""
    cls = ConsentGranted if type(cmd) is GrantConsent else ConsentWithdrawn
    events.append(event_base(cls, cmd, user=_member(cmd)))


def decide_erase(state: LedgerState, ak: str, cmd: EraseSubject, events: list) -> None:
    """Tombstones every live USER record of the member on this agent, and withdraws the
    consent: a later write needs a new grant. The records of other scopes made from their
    turns are their data too: `SubjectErased` forgets them with the rest (`erasure`)."""
    user = _member(cmd)
    for rid in state.subject_records.get(subject_key(ak, user)) or ():
        r = get_record(state, ak, rid)
        events.append(event_base(RecordDeleted, cmd, record=tombstone_record(r, cmd, valid_to=cmd.issued_at)))
    events.append(event_base(ConsentWithdrawn, cmd, user=user, erased=True))
    events.append(event_base(SubjectErased, cmd, user=user))  # the member's keys on this agent go too


def decide_remove_agent(state: LedgerState, ak: str, cmd: RemoveAgent, events: list) -> None:
    events.append(event_base(AgentRemoved, cmd))
    events.append(event_base(SubjectErased, cmd, user=None))


def decide_remove_user(state: LedgerState, ak: str, cmd: RemoveUser, events: list) -> None:
    if cmd.agent != WORKSPACE:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agent",
                       f"a member is removed from the whole tenant: send RemoveUser under {WORKSPACE!r}")
    user = _member(cmd)
    events.append(event_base(UserRemoved, cmd, user=user, erased=cmd.erase))
    if cmd.erase:  # a deleted user is wiped; a member removed from the tenant keeps their facts
        events.append(event_base(SubjectErased, cmd, user=user))  # under the workspace: on every agent


def _workspace_operator(cmd: RestoreUser | RestoreTenant, what: str) -> None:
    if cmd.agent != WORKSPACE:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agent", f"{what} holds for the whole tenant: send "
                       f"{cmd.type} under {WORKSPACE!r}")
    if cmd.provenance.source is not Source.OPERATOR:
        raise Rejected(ErrorCode.FORBIDDEN, None, f"only an operator can {what}")


def decide_restore_user(state: LedgerState, ak: str, cmd: RestoreUser, events: list) -> None:
    """A removed member stays removed until this: an explicit act, logged. A deleted user's
    erased memory and consent do not come back (a new grant is needed); a member only removed
    from the tenant finds their facts and consent as they left them."""
    _workspace_operator(cmd, "restore a member")
    user = _member(cmd)
    if not state.removed_users.get(subject_key(ak, user)):
        raise Rejected(ErrorCode.NOT_FOUND, "user", f"member {user} was not removed; nothing to restore")
    events.append(event_base(UserRestored, cmd, user=user))


def decide_restore_tenant(state: LedgerState, ak: str, cmd: RestoreTenant, events: list) -> None:
    _workspace_operator(cmd, "restore a tenant")
    if f"{cmd.tenant}/*" not in state.erasures:  # `erasure.erasure_key` of a tenant-wide erasure
        raise Rejected(ErrorCode.NOT_FOUND, "tenant", f"tenant {cmd.tenant} was not removed; nothing to restore")
    events.append(event_base(TenantRestored, cmd))
