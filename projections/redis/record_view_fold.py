"""How the record view folds a segment of the log: one table, event type -> the function that
queues its writes, which the live path (`record_view_apply`) and a rebuild's fill
(`record_view_fill`) both run. Records are the exception: each path writes a record's row
its own way (`FoldBatch.record`), so the fold hands rows over rather than writing them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from events.commands import block_field
from events.lean import LeanEvent, as_lean
from events.record import LIVE, Scope, Status
from events.sealing import kid_of
from projections.records import listed, sort_score
from projections.redis import note_view, profile_view, run_view, shared_view
from projections.redis.record_view_keys import REMOVED_TENANTS, agent_key
from projections.redis.record_view_stored import seal_block
from projections.redis.view_store import ViewStore

PURGE_EVENTS = ("SubjectErased", "RecordsPurged")
SUBJECT_EVENTS = ("ConsentGranted", "ConsentWithdrawn", "AgentRemoved", "UserRemoved", "UserRestored",
                  "TenantRestored")

# agent key -> (agent key, block label or None, command id): what a waiting request hears of
Changes = dict[str, list[tuple[str, str | None, str]]]


class FoldView(ViewStore, Protocol):
    """What folding reads and counts on the record view it writes to."""

    unreadable: int
    announce: bool
    applied_channel: str

    async def open_counted(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, or None (counted) for what was sealed under a destroyed key."""
        ...


class Row(NamedTuple):
    """A record event as the view stores it: APPLY's arguments for it, after the agent key."""

    agent: str  # `tenant/agent`
    rid: str
    version: int
    raw: bytes | str  # the event as logged
    score: float
    flags: int  # 1 listed + 2 pinned
    expiry: int  # ms, of a live record; -1 for none
    shadows: str  # the live record a preview record replaces, or ""
    user: str  # the member whose listing a USER record is in, or ""


def row(e: Any) -> Row | None:
    """A record event's row; None for an event that carries no record. A record of another
    scope than USER may name a member too, but is not in their listing."""
    e = as_lean(e)
    r = e.record
    if r is None:
        return None
    expiry = int(r.expires_at.timestamp() * 1000) if r.expires_at and r.status in LIVE else -1
    flags = int(listed(r)) + 2 * int(r.pinned and r.status is Status.ACTIVE)
    shadows = r.replaces if r.preview and r.replaces else ""
    user = r.user if r.scope is Scope.USER and r.user else ""
    return Row(f"{r.tenant}/{r.agent}", r.id, r.version, e.raw, sort_score(r), flags, expiry, shadows, user)


def segments(events: list[LeanEvent]) -> list[tuple[list[LeanEvent], LeanEvent | None]]:
    """The batch cut at each purge: (the events before it, the purge); the last has None."""
    out: list[tuple[list[LeanEvent], LeanEvent | None]] = []
    seg: list[LeanEvent] = []
    for e in events:
        if e.type in PURGE_EVENTS:
            out.append((seg, e))
            seg = []
        else:
            seg.append(e)
    out.append((seg, None))
    return out


def checkpoints(positions: list[tuple[str, int]] | None) -> dict[str, int]:
    """Each checkpoint field's furthest next offset in the batch."""
    ckpt: dict[str, int] = {}
    for field, nxt in positions or ():
        ckpt[field] = max(nxt, ckpt.get(field, 0))
    return ckpt


class FoldBatch:
    """One segment's writes: what the fold table queues goes on `pipe`, one key each, in log
    order; records go to `record`, which each path defines."""

    def __init__(self, view: FoldView, pipe: Any, ns: str) -> None:
        self.view = view
        self.pipe = pipe
        self.ns = ns
        self.changed: Changes = {}
        self.used: dict[str, dict[str, int]] = {}  # agent key -> record id -> largest usage total
        self.expiring: set[str] = set()  # agents with a record that expires

    def record(self, r: Row) -> None:
        raise NotImplementedError

    def heard(self, ak: str, label: str | None, command_id: str) -> None:
        self.changed.setdefault(ak, []).append((ak, label, command_id))

    async def send(self) -> None:
        """The queued writes; the keys this process made go out first, before anything
        sealed under them is written."""
        if not len(self.pipe):
            return
        if self.view.keys is not None:
            await self.view.keys.flush()
        await self.pipe.execute()


Fold = Callable[[FoldBatch, LeanEvent], Awaitable[None]]


async def fold(batch: FoldBatch, events: list[LeanEvent], gone: set[str]) -> None:
    """Queues the segment's writes on `batch`. A record sealed under a key in `gone`
    (destroyed) is not stored at all."""
    for e in events:
        r = row(e) if _readable(batch.view, e, gone) else None
        if r is not None:
            if r.expiry != -1:
                batch.expiring.add(r.agent)
            batch.record(r)
        elif (write := FOLDS.get(e.type)) is not None:
            await write(batch, e)
    if batch.expiring:
        # The sweep's registry of agents with expiring records: written first, so a record
        # with an expiry is never in an agent the sweep does not know of.
        batch.pipe.sadd(f"{batch.ns}:expiring", *sorted(batch.expiring))


def _readable(view: FoldView, e: LeanEvent, gone: set[str]) -> bool:
    r = e.record
    if r is None or r.sealed is None or not gone or kid_of(r.sealed) not in gone:
        return True
    view.unreadable += 1
    return False


async def _config(b: FoldBatch, e: LeanEvent) -> None:
    full = e.full(b.view.codec)
    b.pipe.set(agent_key(b.ns, "config", f"{full.tenant}/{full.agent}"), full.config.model_dump_json())
    if b.view.announce:  # a configuration's writer reads it back at once (read-your-writes)
        b.heard(f"{e.tenant}/{e.agent}", None, e.command_id)


async def _block(b: FoldBatch, e: LeanEvent) -> None:
    """A block's text replaces the last, sealed; an empty one removes the block. Events of
    one agent come in log order, so the last applied is the newest, as for configurations."""
    full = await b.view.open_counted(e.full, b.view.codec)
    if full is None:
        return
    key = agent_key(b.ns, "blocks", f"{full.tenant}/{full.agent}")
    at = block_field(full.label, full.application)  # an application's block: `<application>:<label>`
    if full.text:
        b.pipe.hset(key, at, seal_block(b.view.codec.cipher, full.tenant, full.agent, at, full.text))
    else:
        b.pipe.hdel(key, at)
    b.heard(f"{full.tenant}/{full.agent}", at, e.command_id)


async def _subject(b: FoldBatch, e: LeanEvent) -> None:
    """Consent is the newest grant or withdrawal of the member on the agent; a removal holds
    until an operator restores the member or the tenant. Queued before the batch's records
    and its checkpoint, so a withdrawal is never behind them."""
    full, ns = e.full(b.view.codec), b.ns
    if full.type == "AgentRemoved":
        b.pipe.sadd(f"{ns}:removed_agents:{full.tenant}", full.agent)
    elif full.type == "UserRemoved":
        b.pipe.sadd(f"{ns}:removed_users:{full.tenant}", full.user)
    elif full.type == "UserRestored":
        b.pipe.srem(f"{ns}:removed_users:{full.tenant}", full.user)
    elif full.type == "TenantRestored":
        b.pipe.srem(f"{ns}:{REMOVED_TENANTS}", full.tenant)
    else:
        state = "granted" if full.type == "ConsentGranted" else "withdrawn"
        b.pipe.hset(agent_key(ns, "consent", f"{full.tenant}/{full.agent}"), full.user, state)
    if b.view.announce:  # a wait for a consent or a removal hears of this command's
        b.heard(f"{e.tenant}/{e.agent}", None, e.command_id)


async def _usage(b: FoldBatch, e: LeanEvent) -> None:
    """Usage makes no version: each path writes the batch's largest totals after the fold."""
    mine = b.used.setdefault(f"{e.tenant}/{e.agent}", {})
    for rid, total in e.totals.items():
        mine[rid] = max(total, mine.get(rid, 0))


def _narrow(view_fold: Callable[[Any, str, bytes], None]) -> Fold:
    """A narrow view's fold (session memory, notes, profiles, shared memory): queued before the
    checkpoint, as blocks are."""
    async def write(b: FoldBatch, e: LeanEvent) -> None:
        view_fold(b.pipe, b.ns, e.raw)
    return write


FOLDS: dict[str, Fold] = {
    "AgentConfigured": _config,
    "BlockChanged": _block,
    **dict.fromkeys(SUBJECT_EVENTS, _subject),
    **dict.fromkeys(run_view.RUN_EVENTS, _narrow(run_view.fold)),
    **dict.fromkeys(note_view.NOTE_EVENTS, _narrow(note_view.fold)),
    **dict.fromkeys(profile_view.PROFILE_EVENTS, _narrow(profile_view.fold)),
    **dict.fromkeys(shared_view.SHARED_EVENTS, _narrow(shared_view.fold)),
    "UsageRecorded": _usage,
}
