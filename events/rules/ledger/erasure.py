"""Erasure: what the ledger's state forgets of a subject whose keys are to be destroyed.

`SubjectErased` (after `EraseSubject`, `RemoveAgent`, `RemoveUser` and `RemoveTenant`) names
what is erased. Its fold drops every version of the subject's records, what indexes and counts
them, its staged writes and, for an agent, its blocks: the state is then the fold of the log
without what was sealed under the subject's keys, which is what a recovery reads once they are
destroyed. Markers stay (consent, removals, and when each erasure was, `LedgerState.erasures`,
from which the ledger worker destroys the keys, again after a crash).

`forget` and `drop_records` also serve the worker (a member or a tenant erased on another
partition) and a snapshot's entries that no longer open.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from events.commands import WORKSPACE, RemoveTenant
from events.errors import ErrorCode
from events.lean import decode_lean_record
from events.memory import SubjectErased
from events.record import LIVE, Scope, Source
from events.rules.ledger import notes
from events.rules.ledger.state import RESERVED_KINDS, LedgerState, Rejected, event_base
from events.rules.ledger.subject_rules import count_key
from events.rules.tokens import pin_line_chars
from events.sealing import PERSONAL, SEALED, agent_subject, subject_of, tenant_of

EVERY = "*"  # the agent of an erasure that holds for every agent of the tenant: no agent id holds it


def erasure_key(tenant: str, agent: str, user: str | None, tenant_wide: bool = False) -> str:
    """What an erasure names, spelled as `events.sealing.subject_of` spells subjects: a member on
    one agent, an agent, or with `*` for the agent a member on every agent (a member erased under
    the workspace agent) or the whole tenant."""
    if tenant_wide:
        return f"{tenant}/{EVERY}"
    if user and agent == WORKSPACE:
        agent = EVERY
    return f"{tenant}/{agent}|u:{user}" if user else f"{tenant}/{agent}"


def erasure_of(key: str) -> tuple[str, str | None, str | None]:
    """(tenant, agent or None for every agent, user or None) of an `erasure_key`."""
    head, _, user = key.partition("|u:")
    tenant, _, agent = head.partition("/")
    return tenant, None if agent == EVERY else agent, user or None


# --------------------------------------------------------------------------- decide


def decide_remove_tenant(state: LedgerState, ak: str, cmd: RemoveTenant, events: list) -> None:
    if cmd.agent != WORKSPACE:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agent",
                       f"a tenant is removed as a whole: send RemoveTenant under {WORKSPACE!r}")
    if cmd.provenance.source is not Source.OPERATOR:
        raise Rejected(ErrorCode.FORBIDDEN, None, "only the deployment's operator removes a tenant")
    events.append(event_base(SubjectErased, cmd, user=None, tenant_wide=True))


# --------------------------------------------------------------------------- fold


class _Owner(msgspec.Struct):
    """What an erasure reads of a record (sealed or not: these fields never are)."""

    scope: Scope
    user: str | None = None
    modified: datetime | None = None


class _Staged(msgspec.Struct):
    """When a staged write was made (its envelope is never sealed)."""

    issued_at: datetime


_OWNER = msgspec.json.Decoder(_Owner, strict=False)
_STAGED = msgspec.json.Decoder(_Staged, strict=False)
_JSON = msgspec.json.Decoder()


def covers(key: str, subject: str) -> bool:
    """Whether the erasure `key` (`erasure_key`) takes the keys of `subject` (as
    `events.sealing.subject_of` spells it): an agent's takes its members' too."""
    tenant, agent, user = erasure_of(key)
    if agent is not None:
        return subject == key if user else agent_subject(subject) == key
    return tenant_of(subject) == tenant and (user is None or subject.partition("|u:")[2] == user)


def _record_subject(ak: str, r: _Owner) -> str:
    # The member a record names is its owner whatever its scope (`events.sealing`).
    return f"{ak}|u:{r.user}" if r.user else ak


def _sealed_under(raw: str) -> set[str]:
    """The subjects a staged write was sealed under: its `WriteStaged`'s (by its provenance's
    member) and its own personal fields' (`events.sealing.PERSONAL`)."""
    w = _JSON.decode(raw)
    out = {subject_of(w["tenant"], w["agent"], (w.get("provenance") or {}).get("user"))}
    spec = PERSONAL.get(w.get("type", ""))
    if spec is not None and (SEALED in w or any(w.get(f, blank) != blank for f, blank in spec.fields.items())):
        out.add(spec.subject(w))
    return out


def subject_erased(state: LedgerState, ak: str, event: Any) -> None:
    tenant, agent = ak.split("/", 1)
    key = erasure_key(tenant, agent, event.user, event.tenant_wide)
    forget(state, key)
    last = state.erasures.get(key)
    state.erasures[key] = event.occurred_at if last is None else max(last, event.occurred_at)


def forget(state: LedgerState, key: str, until: datetime | None = None) -> int:
    """Drops what `state` holds under the keys the erasure `key` takes (`covers`): records of
    every version, staged writes, block texts. With `until`, only what was written by then (a
    member may come back later, under new keys). Returns how many records it dropped."""
    tenant, agent, _ = erasure_of(key)
    prefix = f"{tenant}/{agent}/" if agent is not None else f"{tenant}/"
    dropped: dict[str, set[str]] = {}
    for k in [k for k in state.records if k.startswith(prefix)]:
        ak, rid = k.rsplit("/", 1)
        r = _OWNER.decode(state.records[k])
        if not covers(key, _record_subject(ak, r)):
            continue
        if until is not None and r.modified is not None and r.modified > until:
            continue
        dropped.setdefault(ak, set()).add(rid)
    n = drop_records(state, dropped, also={ck for ck in state.stats if covers(key, ck)})

    def taken(raw: str) -> bool:
        if until is not None and _STAGED.decode(raw).issued_at > until:
            return False
        return any(covers(key, s) for s in _sealed_under(raw))

    for skey in [k for k in state.staged if f"{k.split('|', 1)[0]}/".startswith(prefix)]:
        restage(state, skey, [raw for raw in state.staged[skey] if not taken(raw)])
    for ak in [a for a in state.blocks if covers(key, a)]:
        del state.blocks[ak]
    # Notes are their owner's (the agent's, or a member's on it), keyed as subjects are.
    notes.drop_owned(state, lambda owner: covers(key, owner), until)
    # A removed tenant's conventions and floors (`tenant`), kept under its workspace agent.
    for ak in [a for a in state.shared if covers(key, a)]:
        del state.shared[ak]
    # Profiles are their member's (`profiles`), keyed by the member's subject key.
    for pk in [k for k, p in state.profiles.items() if covers(key, k) and (until is None or p[2] <= until)]:
        del state.profiles[pk]
    return n


def drop_records(state: LedgerState, dropped: dict[str, set[str]], also: Iterable[str] = ()) -> int:
    """Removes the records `dropped` names (agent key -> ids), the index entries that point at
    them, their ids from their subjects', and counts again what they were counted under (and the
    count keys `also`): a count key no record is counted under any more goes, as a fold that
    never saw them has none. The records may be sealed: only their ids, scope and user are read."""
    touched = set(also)
    n = 0
    for ak, rids in dropped.items():
        for rid in rids:
            raw = state.records.pop(f"{ak}/{rid}", None)
            if raw is not None:
                touched.add(count_key(ak, _OWNER.decode(raw)))
                n += 1
    if not touched:
        return n
    for k in [k for k, v in state.index.items() if v in dropped.get(k.split("|", 1)[0], ())]:
        del state.index[k]
    counts = _recount(state, touched)
    for ck in touched:
        if ck in counts:
            state.stats[ck] = counts[ck]
        else:
            state.stats.pop(ck, None)
        if "|u:" in ck:
            gone = dropped.get(ck.split("|", 1)[0], set())
            held = tuple(rid for rid in state.subject_records.get(ck) or () if rid not in gone)
            if held or ck in counts and ck in state.subject_records:
                state.subject_records[ck] = held
            else:
                state.subject_records.pop(ck, None)
    return n


def _recount(state: LedgerState, keys: set[str]) -> dict[str, dict[str, int]]:
    """The live facts and pinned characters of the records counted under `keys`, as `fold._store`
    counts them one by one."""
    prefixes = tuple({f"{ck.split('|', 1)[0]}/" for ck in keys})
    counts: dict[str, dict[str, int]] = {}
    for k, raw in state.records.items():
        if not k.startswith(prefixes):
            continue
        r = decode_lean_record(raw)
        ck = count_key(k.rsplit("/", 1)[0], r)
        if ck not in keys:
            continue
        c = counts.setdefault(ck, {"live": 0, "pinned_chars": 0})
        c["live"] += r.status in LIVE and r.kind not in RESERVED_KINDS
        c["pinned_chars"] += pin_line_chars(r) if r.pinned else 0
    return counts


def restage(state: LedgerState, key: str, writes: list[str]) -> None:
    """The staged writes of turn `key` (`agent|turn_ref`) are now `writes`; the turn counts as
    open from the first of them, as it would have if the others were never staged."""
    ak = key.split("|", 1)[0]
    if writes == list(state.staged.get(key) or ()):
        return
    first = _STAGED.decode(writes[0]).issued_at if writes else None
    opened = {k: first if k == key else at for k, at in (state.open_turns.get(ak) or {}).items()
              if k != key or writes}
    if writes:
        state.staged[key] = writes
        opened.setdefault(key, first)
    else:
        state.staged.pop(key, None)
    if opened:
        state.open_turns[ak] = opened
    else:
        state.open_turns.pop(ak, None)
