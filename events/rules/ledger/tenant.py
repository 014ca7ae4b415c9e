"""Tenant and platform memory in the ledger (docs/features/tenant-platform-memory.md).

A tenant's conventions and floors are kept under its workspace agent (`tenant/@workspace`), the
platform's entries under `@platform/@workspace`: each on one ledger partition, so counts and
statuses are decided in log order. The state keeps ids and statuses only (`LedgerState.shared`);
the texts travel on the events, which the projections keep.

- `ProposeConvention` (the conventions worker): a new fact key becomes a candidate; a candidate
  seen in more agents is proposed again with them all; an approved one changes no more; a
  rejected one is proposed again only when an agent that was not among those it was rejected
  with establishes it too (the same agents repeating it never bring it back).
- `DecideConvention` (a tenant administrator, source OPERATOR): approve or reject, from any
  status, so an approval can be withdrawn by a rejection and a rejection reconsidered.
- `SetTenantFloor` / `RemoveTenantFloor`: at most `MAX_FLOORS` per tenant, and no more than
  the floors' recall budget holds: floors are always in context, so one that would not fit is
  refused rather than left out of some recall.
- `SetPlatformEntry` / `RemovePlatformEntry`: at most `MAX_PLATFORM` of each kind; policies,
  always in context too, within their budget as floors are.

The state keeps, per floor and policy, the characters it takes in the block (`chars` on the
event), so the budget is checked with no text in the state.
"""

from __future__ import annotations

from typing import Any

from events.commands import (
    PLATFORM,
    WORKSPACE,
    DecideConvention,
    ProposeConvention,
    RemovePlatformEntry,
    RemoveTenantFloor,
    SetPlatformEntry,
    SetTenantFloor,
)
from events.errors import ErrorCode
from events.memory import (
    ConventionApproved,
    ConventionProposed,
    ConventionRejected,
    PlatformEntryRemoved,
    PlatformEntrySet,
    TenantFloorRemoved,
    TenantFloorSet,
)
from events.record import Source
from events.rules.ledger.state import LedgerState, Rejected, event_base
from events.rules.recall_render import RESERVED, Entry, entry_cost, layer_cost

MAX_FLOORS = 20  # per tenant: every floor is in every recall, so they stay few
MAX_PLATFORM = 20  # of each kind: every tenant's every recall carries them
CANDIDATE, APPROVED, REJECTED = "candidate", "approved", "rejected"


def _items(state: LedgerState, ak: str) -> dict[str, str]:
    return dict(state.shared.get(ak) or {})


def convention(state: LedgerState, ak: str, cid: str) -> tuple[str, frozenset[str]] | None:
    """(status, agents) of the convention, or None when never proposed."""
    raw = (state.shared.get(ak) or {}).get(f"c:{cid}")
    if raw is None:
        return None
    status, _, agents = raw.partition("|")
    return status, frozenset(a for a in agents.split(",") if a)


def _within_budget(heading: str, others: list[int], cost: int, field: str, what: str) -> None:
    """Refuses an entry that would take its always-shown layer past the layer's budget."""
    total, budget = layer_cost(heading, [*others, cost]), RESERVED[heading]
    if total > budget:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, field,
                       f"{what} would take {total} characters of every recall, over the {budget} they always "
                       f"have; shorten it, or shorten or remove another")


def _kind(value: str) -> str:
    return value.partition("|")[0]


def _chars(value: str) -> int:
    """The characters an entry takes, from its state value (`kind|chars` or `chars`)."""
    tail = value.rpartition("|")[2]
    return int(tail) if tail.isdigit() else 0


def _tenant_side(cmd: Any, what: str) -> None:
    if cmd.agent != WORKSPACE or cmd.tenant == PLATFORM:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agent",
                       f"{what} belongs to a tenant: send it under the tenant's {WORKSPACE!r} agent")


def _administrator(cmd: Any, what: str) -> None:
    if cmd.provenance.source is not Source.OPERATOR:
        raise Rejected(ErrorCode.FORBIDDEN, None, f"only a tenant administrator (an operator key) can {what}")


def _propose(state: LedgerState, ak: str, cmd: ProposeConvention, events: list) -> None:
    _tenant_side(cmd, "a convention")
    agents = frozenset(cmd.agents)
    if len(agents) < 2:  # one agent repeating a fact never makes a convention
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agents", "a convention needs the fact in two or more agents")
    cur = convention(state, ak, cmd.convention)
    if cur is not None:
        status, seen = cur
        if status == APPROVED or agents <= seen:
            return  # nothing new: a replayed or repeated proposal changes nothing
        agents |= seen
    events.append(event_base(ConventionProposed, cmd, entry_id=cmd.convention, text=cmd.text, agents=sorted(agents)))


def _decide(state: LedgerState, ak: str, cmd: DecideConvention, events: list) -> None:
    _tenant_side(cmd, "a convention")
    _administrator(cmd, "approve or reject a convention")
    if convention(state, ak, cmd.convention) is None:
        raise Rejected(ErrorCode.NOT_FOUND, "convention",
                       f"no convention {cmd.convention} in this tenant; list them with GET /v1/tenant/conventions")
    cls = ConventionApproved if cmd.decision == "approve" else ConventionRejected
    events.append(event_base(cls, cmd, entry_id=cmd.convention))


def _set_floor(state: LedgerState, ak: str, cmd: SetTenantFloor, events: list) -> None:
    _tenant_side(cmd, "a floor")
    _administrator(cmd, "set a tenant floor")
    items = _items(state, ak)
    floors = [k for k in items if k.startswith("f:")]
    if f"f:{cmd.floor}" not in items and len(floors) >= MAX_FLOORS:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "floor",
                       f"the tenant has {len(floors)} floors, the limit is {MAX_FLOORS}; replace or remove one")
    cost = entry_cost(Entry(cmd.floor, cmd.text))
    _within_budget("Tenant floors", [_chars(items[k]) for k in floors if k != f"f:{cmd.floor}"], cost, "text",
                   "the tenant's floors")
    events.append(event_base(TenantFloorSet, cmd, entry_id=cmd.floor, text=cmd.text, chars=cost))


def _remove_floor(state: LedgerState, ak: str, cmd: RemoveTenantFloor, events: list) -> None:
    _tenant_side(cmd, "a floor")
    _administrator(cmd, "remove a tenant floor")
    if f"f:{cmd.floor}" not in (state.shared.get(ak) or {}):
        raise Rejected(ErrorCode.NOT_FOUND, "floor", f"no floor {cmd.floor} in this tenant; list them with "
                       "GET /v1/tenant/floors")
    events.append(event_base(TenantFloorRemoved, cmd, entry_id=cmd.floor))


def _platform_side(cmd: Any) -> None:
    if cmd.tenant != PLATFORM or cmd.agent != WORKSPACE:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "tenant",
                       f"platform entries are sent under tenant {PLATFORM!r}, agent {WORKSPACE!r}")
    _administrator(cmd, "change platform memory")


def _set_platform(state: LedgerState, ak: str, cmd: SetPlatformEntry, events: list) -> None:
    _platform_side(cmd)
    items = _items(state, ak)
    same = [k for k, v in items.items() if k.startswith("p:") and _kind(v) == cmd.kind and k != f"p:{cmd.entry}"]
    if len(same) >= MAX_PLATFORM:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "kind",
                       f"the platform has {len(same)} {cmd.kind} entries, the limit is {MAX_PLATFORM}; "
                       "replace or remove one")
    cost = entry_cost(Entry(cmd.entry, cmd.text))
    if cmd.kind == "policy":  # defaults may be overridden, and left out when there is no room
        _within_budget("Policy", [_chars(items[k]) for k in same], cost, "text", "the platform's policies")
    events.append(event_base(PlatformEntrySet, cmd, entry_id=cmd.entry, kind=cmd.kind, text=cmd.text, chars=cost))


def _remove_platform(state: LedgerState, ak: str, cmd: RemovePlatformEntry, events: list) -> None:
    _platform_side(cmd)
    if f"p:{cmd.entry}" not in (state.shared.get(ak) or {}):
        raise Rejected(ErrorCode.NOT_FOUND, "entry", f"no platform entry {cmd.entry}; list them with "
                       "GET /v1/platform/entries")
    events.append(event_base(PlatformEntryRemoved, cmd, entry_id=cmd.entry))


# Applied at once, never staged on a turn: an administrator's act, not an agent's write.
HANDLERS = {
    ProposeConvention: _propose,
    DecideConvention: _decide,
    SetTenantFloor: _set_floor,
    RemoveTenantFloor: _remove_floor,
    SetPlatformEntry: _set_platform,
    RemovePlatformEntry: _remove_platform,
}


# --------------------------------------------------------------------------- fold
# Each reads `entry_id`, `agents` and `kind` of a contract event or of its `LedgerView` alike.


def _put(state: LedgerState, ak: str, key: str, value: str | None) -> None:
    items = _items(state, ak)
    if value is None:
        items.pop(key, None)
    else:
        items[key] = value
    state.shared[ak] = items


def _proposed(state: LedgerState, ak: str, e: Any) -> None:
    _put(state, ak, f"c:{e.entry_id}", f"{CANDIDATE}|{','.join(sorted(e.agents))}")


def _decided(status: str):
    def fold(state: LedgerState, ak: str, e: Any) -> None:
        cur = convention(state, ak, e.entry_id)
        agents = cur[1] if cur else frozenset()
        _put(state, ak, f"c:{e.entry_id}", f"{status}|{','.join(sorted(agents))}")

    return fold


FOLDS = {
    "ConventionProposed": _proposed,
    "ConventionApproved": _decided(APPROVED),
    "ConventionRejected": _decided(REJECTED),
    "TenantFloorSet": lambda state, ak, e: _put(state, ak, f"f:{e.entry_id}", str(e.chars)),
    "TenantFloorRemoved": lambda state, ak, e: _put(state, ak, f"f:{e.entry_id}", None),
    "PlatformEntrySet": lambda state, ak, e: _put(state, ak, f"p:{e.entry_id}", f"{e.kind}|{e.chars}"),
    "PlatformEntryRemoved": lambda state, ak, e: _put(state, ak, f"p:{e.entry_id}", None),
}
