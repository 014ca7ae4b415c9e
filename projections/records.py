"""The record view port, and the pure in-memory fold every adapter must agree with.

A view keeps, per agent: every version of every record, the current version, a
newest-first listing of live records, and the pinned set; per member of the agent, a
listing of their USER records (listed as the agent's listing lists them), and the set of
members who have (had) any, so that a member's list and an operator's counts read that
member's records only. Applying an event is a version-guarded upsert of the snapshot it
carries, so duplicates and redeliveries are no-ops and the order of distinct versions
does not matter.

`SubjectErased` drops everything of its subject (`Erasure`): every version of its records,
its listings, its consent rows, and for a whole agent its blocks. `RecordsPurged` drops every
version of the records it names. Both are idempotent: a replay applies them again.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from events.codec import ContractError, decode
from events.commands import WORKSPACE, block_field
from events.memory import (
    RECORD_EVENTS,
    AgentRemoved,
    BlockChanged,
    ConsentGranted,
    ConsentWithdrawn,
    RecordsPurged,
    SubjectErased,
    TenantRestored,
    UsageRecorded,
    UserRemoved,
    UserRestored,
)
from events.record import LIVE, MemoryRecord, Scope, Status
from events.rules.subjects import SubjectState
from events.sealing import KeyDestroyed, KeyMissing


class Keys(Protocol):
    """The process's data keys (`workers.runtime.data_keys.KeyTopic`), as a view uses them."""

    async def catch_up(self) -> None:
        """Learns every key published so far."""

    async def flush(self) -> None:
        """Publishes the keys this process made: before anything sealed under them is written."""


async def opening(keys: Keys | None, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, which opens something sealed, or None when it was sealed under a destroyed
    key. A key not known yet is caught up on once; still unknown then, it was destroyed.
    Without `keys` a key not known yet is the caller's to catch up on (`KeyMissing`)."""
    try:
        return fn(*args)
    except KeyDestroyed:
        return None
    except KeyMissing:
        if keys is None:
            raise
    await keys.catch_up()
    try:
        return fn(*args)
    except (KeyMissing, KeyDestroyed):
        return None


def listed(r: MemoryRecord) -> bool:
    """Listing omits deleted and superseded records, except preview deletions."""
    return r.status in LIVE or (r.preview and r.status is Status.DELETED)


def with_usage(r: MemoryRecord, usage_count: int) -> MemoryRecord:
    """The current version as read: its usage count is the latest the view holds, which usage
    events move without a new version (docs/features/trust.md)."""
    return r.model_copy(update={"usage_count": usage_count}) if usage_count > r.usage_count else r


def sort_score(r: MemoryRecord) -> float:
    return r.created.timestamp() * 1000


def encode_cursor(score: float, rid: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([score, rid]).encode()).decode().rstrip("=")


class CursorError(ValueError):
    """A paging cursor this service did not issue."""


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        pad = "=" * (-len(cursor) % 4)
        score, rid = json.loads(base64.urlsafe_b64decode(cursor + pad))
        score = float(score)
        if math.isnan(score):  # Python's JSON reads NaN; no sort score is one, and Redis refuses it
            raise ValueError("NaN")
        return score, str(rid)
    except Exception as e:
        raise CursorError("not a cursor this API returned; pass next_cursor from the previous page") from e


@dataclass(frozen=True)
class Erasure:
    """What a `SubjectErased` reaches: one tenant, one agent of it or (None) every agent, and
    one member or (None) everything of those agents. A member's things are the records that
    name them (made from their turns, in any scope), their consent, and the history of their
    turns."""

    tenant: str
    agent: str | None
    user: str | None

    @classmethod
    def of(cls, e: Any) -> Erasure:
        """From a `SubjectErased` (full or lean: it reads tenant, agent, user, tenant_wide)."""
        if e.tenant_wide:
            return cls(e.tenant, None, e.user)
        if e.user is not None and e.agent == WORKSPACE:
            return cls(e.tenant, None, e.user)  # the member on every agent of the tenant
        return cls(e.tenant, e.agent, e.user)

    def covers_agent(self, tenant: str, agent: str) -> bool:
        return tenant == self.tenant and (self.agent is None or agent == self.agent)

    def covers(self, tenant: str, agent: str, user: str | None) -> bool:
        """Whether a thing of (tenant, agent) that is `user`'s (None: no member's) is erased."""
        return self.covers_agent(tenant, agent) and (self.user is None or user == self.user)

    def covers_record(self, r: Any) -> bool:
        # A record naming a member is theirs whatever its scope: it was made from their turn.
        return self.covers(r.tenant, r.agent, r.user)

    def covers_subject(self, subject: str) -> bool:
        """A data key's subject (`events.sealing.subject_of`): `tenant/agent` or `tenant/agent|u:user`."""
        agent_part, _, user = subject.partition("|u:")
        tenant, _, agent = agent_part.partition("/")
        return self.covers(tenant, agent, user or None)

    @property
    def everywhere(self) -> bool:
        """Whether it reaches agents other than the one whose partition carries it."""
        return self.agent is None


@dataclass
class Page:
    records: list[MemoryRecord]
    next_cursor: str | None


class RecordView(Protocol):
    """The read side of memory records. Implemented by `MemoryFold` and `RedisRecords`."""

    async def apply(self, events: list[Any]) -> None: ...

    async def get(self, tenant: str, agent: str, rid: str, version: int | None = None) -> MemoryRecord | None: ...

    async def history(self, tenant: str, agent: str, rid: str) -> list[MemoryRecord]: ...

    async def page(
        self, tenant: str, agent: str, limit: int, after: str | None = None, ascending: bool = False,
        user: str | None = None,
    ) -> Page:
        """Listed records by creation time, newest first unless `ascending`, `limit` a page
        after the cursor `after`. With `user`: that member's listing, their USER records only
        (a record of another scope that names them is not theirs)."""
        ...

    async def users(self, tenant: str, agent: str) -> set[str]:
        """The members who have, or had, USER records on the agent."""
        ...

    async def pinned(self, tenant: str, agent: str) -> list[MemoryRecord]: ...

    async def shadowed(self, tenant: str, agent: str) -> set[str]: ...

    async def blocks(self, tenant: str, agent: str) -> dict[str, str]: ...

    async def subject(self, tenant: str, agent: str, user: str | None) -> SubjectState: ...

    async def consents(self, tenant: str, agent: str) -> dict[str, str]: ...


@dataclass
class MemoryFold:
    """The reference fold: plain dicts, no I/O."""

    versions: dict[tuple[str, str, str], dict[int, MemoryRecord]] = field(default_factory=dict)
    current: dict[tuple[str, str, str], int] = field(default_factory=dict)
    shadows: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    block_texts: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    consent: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    removed_agents: set[tuple[str, str]] = field(default_factory=set)
    removed_users: set[tuple[str, str]] = field(default_factory=set)
    removed_tenants: set[str] = field(default_factory=set)
    # Each record's usage_count, kept beside its versions: usage makes no version (docs/features/trust.md).
    usage: dict[tuple[str, str, str], int] = field(default_factory=dict)

    async def apply(self, events: list[Any]) -> None:
        for e in events:
            if isinstance(e, SubjectErased):
                self._erase(Erasure.of(e))
                if e.tenant_wide:
                    self.removed_tenants.add(e.tenant)  # removed until restored
            elif isinstance(e, RecordsPurged):
                self._drop({(e.tenant, e.agent, rid) for rid in e.record_ids})
            elif isinstance(e, UsageRecorded):
                for rid, total in e.totals.items():
                    k = (e.tenant, e.agent, rid)
                    self.usage[k] = max(total, self.usage.get(k, 0))
            if isinstance(e, (ConsentGranted, ConsentWithdrawn)):
                state = "granted" if isinstance(e, ConsentGranted) else "withdrawn"
                self.consent.setdefault((e.tenant, e.agent), {})[e.user] = state
            elif isinstance(e, AgentRemoved):
                self.removed_agents.add((e.tenant, e.agent))
            elif isinstance(e, UserRemoved):
                self.removed_users.add((e.tenant, e.user))
            elif isinstance(e, UserRestored):
                self.removed_users.discard((e.tenant, e.user))
            elif isinstance(e, TenantRestored):
                self.removed_tenants.discard(e.tenant)
            if isinstance(e, BlockChanged):
                texts = self.block_texts.setdefault((e.tenant, e.agent), {})
                at = block_field(e.label, e.application)  # as the Redis view keys it
                if e.text:
                    texts[at] = e.text
                else:
                    texts.pop(at, None)
            if isinstance(e, RECORD_EVENTS):
                r = e.record
                k = (r.tenant, r.agent, r.id)
                self.versions.setdefault(k, {}).setdefault(r.version, r)
                if r.version > self.current.get(k, 0):
                    self.current[k] = r.version
                if r.preview and r.replaces:
                    self.shadows.setdefault((r.tenant, r.agent), set()).add(r.replaces)

    def _drop(self, keys: set[tuple[str, str, str]]) -> None:
        for k in keys:
            self.versions.pop(k, None)
            self.current.pop(k, None)
            self.usage.pop(k, None)
            if k[:2] in self.shadows:
                self.shadows[k[:2]].discard(k[2])

    def _erase(self, er: Erasure) -> None:
        self._drop({k for k, v in self.current.items() if er.covers_record(self.versions[k][v])})
        for (t, a), rows in self.consent.items():
            if er.covers_agent(t, a):
                for user in [u for u in rows if er.user is None or u == er.user]:
                    del rows[user]
        if er.user is None:
            for ta in [ta for ta in self.block_texts if er.covers_agent(*ta)]:
                del self.block_texts[ta]
            for ta in [ta for ta in self.shadows if er.covers_agent(*ta)]:
                del self.shadows[ta]

    async def get(self, tenant, agent, rid, version=None):
        vs = self.versions.get((tenant, agent, rid))
        if not vs:
            return None
        if version is None:
            return with_usage(vs[self.current[(tenant, agent, rid)]], self.usage.get((tenant, agent, rid), 0))
        return vs.get(version)

    async def history(self, tenant, agent, rid):
        vs = self.versions.get((tenant, agent, rid)) or {}
        return [vs[v] for v in sorted(vs, reverse=True)]

    def records_of(self, tenant: str, agent: str) -> list[MemoryRecord]:
        """The agent's records in their current versions, whatever their status."""
        return list(self._current(tenant, agent))

    def _current(self, tenant, agent):
        for (t, a, rid), v in self.current.items():
            if t == tenant and a == agent:
                yield with_usage(self.versions[(t, a, rid)][v], self.usage.get((t, a, rid), 0))

    async def page(self, tenant, agent, limit, after=None, ascending=False, user=None):
        rows = sorted(
            ((sort_score(r), r.id, r) for r in self._current(tenant, agent)
             if listed(r) and (user is None or (r.scope is Scope.USER and r.user == user))),
            key=lambda x: (x[0], x[1]),
            reverse=not ascending,
        )
        if after:
            c = decode_cursor(after)
            rows = [x for x in rows if ((x[0], x[1]) > c if ascending else (x[0], x[1]) < c)]
        chunk = rows[:limit]
        nxt = encode_cursor(chunk[-1][0], chunk[-1][1]) if len(rows) > limit else None
        return Page([x[2] for x in chunk], nxt)

    async def users(self, tenant, agent):
        return {r.user for (t, a, _), vs in self.versions.items() if t == tenant and a == agent
                for r in vs.values() if r.scope is Scope.USER and r.user}

    async def pinned(self, tenant, agent):
        rs = [r for r in self._current(tenant, agent) if r.pinned and r.status is Status.ACTIVE]
        return sorted(rs, key=lambda r: (sort_score(r), r.id))

    async def shadowed(self, tenant, agent):
        return set(self.shadows.get((tenant, agent), ()))

    async def blocks(self, tenant, agent):
        return dict(self.block_texts.get((tenant, agent), {}))

    async def subject(self, tenant, agent, user):
        return SubjectState(
            consent=self.consent.get((tenant, agent), {}).get(user) if user is not None else None,
            agent_removed=(tenant, agent) in self.removed_agents,
            user_removed=user is not None and (tenant, user) in self.removed_users,
            tenant_removed=tenant in self.removed_tenants,
        )

    async def consents(self, tenant, agent):
        return dict(self.consent.get((tenant, agent), {}))


# The memory events' erasures, for followers of that topic that need only them.
ERASED_MARK = b'"SubjectErased"'


class _Type(msgspec.Struct):
    type: str = ""


_TYPE = msgspec.json.Decoder(_Type)


def erasure_of(source: str, value: bytes) -> Any:
    """A `SubjectErased` of the memory events, or None for any other event (not decoded:
    most are sealed, and history needs none of them). The mark only pre-filters: a record
    whose kind or label reads "SubjectErased" is still not opened (its key may be unknown
    here, or destroyed)."""
    if ERASED_MARK not in value:
        return None
    try:
        kind = _TYPE.decode(value).type
    except msgspec.DecodeError as e:
        raise ContractError("$", str(e)) from None
    return decode(source, value) if kind == "SubjectErased" else None


def erasure_at(e: SubjectErased) -> tuple[Erasure, int]:
    return Erasure.of(e), int(e.occurred_at.timestamp() * 1000)
