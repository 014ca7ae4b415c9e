"""Session history rules: what a turn keeps, and how history is searched.

Pure functions, no I/O: what a committed turn keeps, how a long event splits into
parts, how a result is rendered, and the filters and cursors of a history search.
Both history projections (Redis in `memlane worker history`, Qdrant Edge in the API
process) fold turns through `kept_events`, so they keep exactly the same events.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from events.ids import uuid5
from events.turns import Message, TurnCommitted

# About 500 tokens: small enough that one part is about one thing for the embedder
# (which reads 256 tokens) and for BM25, large enough that most messages are one part.
PART_CHARS = 2000
# History search pages; a ranked search pages through at most this many hits.
MAX_RANKED_DEPTH = 1000
# A listing key orders events within a session: turn first, then the message's place in it.
SEQ_SLOTS = 1000

Kind = Literal["message", "tool_result", "tool_error"]
KINDS_BY_INDEX: dict[str, tuple[str, ...]] = {
    "messages": ("message",),
    "messages_and_tools": ("message", "tool_result", "tool_error"),
}
POINT_NS = uuid.UUID("2b0f7d8e-51a4-4c1e-9a77-8f3c1d2e6b40")


@dataclass(frozen=True)
class KeptEvent:
    """One kept message of a committed turn: what history search finds and reads."""

    id: str
    tenant: str
    agent: str
    session: str
    turn: int
    attempt: int
    execution_id: str
    sequence: int
    role: str
    kind: str
    text: str
    preview: bool
    occurred_ms: int
    call_id: str | None = None
    tool_name: str | None = None
    calls: tuple[str, ...] = ()
    # The member whose turn said it (the turn's `user`); None for a turn of no member. An
    # event stored before this field existed reads as None.
    user: str | None = None

    @property
    def session_key(self) -> str:
        return f"{self.tenant}/{self.agent}/{self.session}"

    @property
    def order(self) -> int:
        return self.turn * SEQ_SLOTS + self.sequence

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> KeptEvent:
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeptEvent:
        d["calls"] = tuple(d.get("calls") or ())
        return cls(**d)


def message_kind(m: Message) -> Kind:
    if m.role == "tool":
        return "tool_error" if m.is_error else "tool_result"
    return "message"


def message_text(m: Message) -> str:
    """The searchable text: the content, plus the tools a reply called."""
    parts = [m.content] if m.content else []
    for c in m.tool_calls:
        args = json.dumps(c.arguments, sort_keys=True, ensure_ascii=False)
        parts.append(f"[called {c.name} {args}]")
    return "\n".join(parts)


def kept_events(turn: TurnCommitted) -> list[KeptEvent]:
    """Every message of a committed turn that history may keep.

    Tool results and errors are kept with their kind; `harness.history.index` then
    decides at search time whether they are found (see `kinds_for`). That keeps the
    projections a function of the turns topic alone, so a replay rebuilds them exactly,
    whatever the agent's configuration was when the turn went by.
    Never kept: skill loads and the agent's own retrievals (memory it read back), system
    instructions (not something a turn said), anything of an agent without sessions, and
    anything of a turn that ended `failed`: only what a turn commits is kept.
    """
    if not turn.session or turn.status == "failed":
        return []
    out: list[KeptEvent] = []
    ms = int(turn.occurred_at.timestamp() * 1000)
    for seq, m in enumerate(turn.messages):
        if m.origin != "conversation" or m.role == "system":
            continue
        text = message_text(m)
        if not text.strip():
            continue
        out.append(
            KeptEvent(
                id=m.id,
                tenant=turn.tenant,
                agent=turn.agent,
                session=turn.session,
                turn=turn.turn,
                attempt=turn.attempt,
                execution_id=turn.execution_id,
                sequence=seq,
                role=m.role,
                kind=message_kind(m),
                text=text,
                preview=turn.preview,
                occurred_ms=ms,
                call_id=m.tool_call_id,
                tool_name=m.tool_name,
                calls=tuple(c.id for c in m.tool_calls),
                user=turn.user,
            )
        )
    return out


# ---------------------------------------------------------------------------- erasures

ANY = "*"  # no agent or member id is "*"


def erasure_marker(tenant: str, agent: str | None, user: str | None) -> str:
    """An erasure as history remembers it: of one agent or (None) every agent of the tenant,
    of one member or (None) everything of them."""
    return f"{tenant}/{agent or ANY}|{user or ANY}"


def erased(markers: dict[str, int], e: KeptEvent) -> bool:
    """Whether an erasure that came after `e` (`markers`: erasure marker -> when, Unix ms)
    reaches it: a turn folded late (its topic behind the events') is not kept again."""
    users = (e.user, ANY) if e.user else (ANY,)
    for agent in (e.agent, ANY):
        for user in users:
            at = markers.get(f"{e.tenant}/{agent}|{user}")
            if at is not None and e.occurred_ms <= at:
                return True
    return False


def kinds_for(index: str) -> tuple[str, ...]:
    return KINDS_BY_INDEX[index]


def across_conversations(cfg: Any) -> bool:
    """Whether the agent (an `AgentConfig`) reads history of its other sessions, not only the
    caller's: history on and `harness.history.across_conversations` set."""
    return bool(cfg.history and cfg.history.across_conversations)


def reachable(session: str, home: str | None, across: bool) -> bool:
    """Whether a message of `session` is reachable from the caller's session `home`: its own
    always, another only across conversations."""
    return across or session == home


def split_parts(text: str, size: int = PART_CHARS) -> list[str]:
    """Split a long text into parts of at most `size` characters, at whitespace when it can.

    Joining the parts gives the text back, so reading by id and reading parts agree.
    """
    if len(text) <= size:
        return [text]
    parts: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            cut = max(cut, text.rfind("\n", start + size // 2, end))
            if cut > start:
                end = cut + 1
        parts.append(text[start:end])
        start = end
    return parts


def event_from_payload(p: dict[str, Any]) -> KeptEvent:
    """A search hit's event, carrying the text of the hit's part."""
    return KeptEvent(
        id=p["event_id"],
        tenant=p["tenant"],
        agent=p["agent"],
        session=p["session"],
        turn=p["turn"],
        attempt=p["attempt"],
        execution_id=p["execution_id"],
        sequence=p["sequence"],
        role=p["role"],
        kind=p["kind"],
        text=p["text"],
        preview=p["visibility"] == "preview",
        occurred_ms=p["occurred_ms"],
        call_id=p.get("call_id"),
        tool_name=p.get("tool_name"),
        calls=tuple(p.get("calls") or ()),
        user=p.get("user"),
    )


def point_id(e: KeptEvent, part: int) -> str:
    return uuid5(POINT_NS, f"{e.session_key}/{e.id}/{part}")


def parts_of(e: KeptEvent) -> list[tuple[str, int, int, str]]:
    """(point id, part, parts, text) of each part of a kept event. The embedding worker names
    a part's vector by its point id and the history projection joins on it, so both split
    through here."""
    texts = split_parts(e.text)
    return [(point_id(e, i + 1), i + 1, len(texts), t) for i, t in enumerate(texts)]


def header(e: KeptEvent) -> str:
    """The line before a result's text, e.g. `turn 12, user` or `turn 3, tool lookup error`."""
    if e.kind == "message":
        who = e.role
    else:
        who = "tool" + (f" {e.tool_name}" if e.tool_name else "") + (" error" if e.kind == "tool_error" else "")
    return f"turn {e.turn}, {who}"


def render(e: KeptEvent, text: str, part: int | None, parts: int, score: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.id,
        "turn": e.turn,
        "role": e.role,
        "kind": e.kind,
        "text": f"{header(e)}\n{text}",
        "execution_id": e.execution_id,
        "sequence": e.sequence,
        "part": part,
        "parts": parts,
        "occurred_at": datetime.fromtimestamp(e.occurred_ms / 1000, UTC).isoformat(),
    }
    if e.call_id:
        out["call_id"] = e.call_id
        out["tool_name"] = e.tool_name
    if e.calls:
        out["calls"] = list(e.calls)
    if score is not None:
        out["score"] = score
    return out


# ---------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class HistoryFilter:
    """What one history search may see, and what the caller narrowed it to."""

    tenant: str
    agent: str
    session: str | None  # None: every session of the agent (history across conversations)
    preview: bool
    kinds: tuple[str, ...]
    before_turn: int | None = None  # as of a turn: only turns before it
    conversation: str | None = None  # an execution of the session
    since_ms: int | None = None  # inclusive
    until_ms: int | None = None  # exclusive
    ids: tuple[str, ...] = ()
    # Who reads: a member's turns are found only by an agent or helper key speaking for that
    # member (X-User); events of no member by anyone. An operator key never finds a member's
    # turns, whatever `memory.consent` says.
    user: str | None = None
    operator: bool = False
    # Across sessions (`session` None): the caller's own session and current turn, (session,
    # turn). That session is bounded by the turn as a session search is; other sessions' turn
    # numbers are not comparable, so they are not. The Qdrant filter does not apply it: the
    # API drops such hits (`bounds_own`).
    own_turn: tuple[str, int] | None = None

    def bounds_own(self, e: KeptEvent) -> bool:
        """False for an event of the caller's own session at or after its current turn."""
        return self.bounds_turn(e.session, e.turn)

    def bounds_turn(self, session: str, turn: int) -> bool:
        return self.own_turn is None or session != self.own_turn[0] or turn < self.own_turn[1]

    def sees_member(self, user: str | None) -> bool:
        """Whether this search may find an event of member `user` (None: of no member)."""
        return user is None or (not self.operator and user == self.user)

    def admits(self, e: KeptEvent) -> bool:
        """The same rule the Qdrant filter applies, for reads that come from Redis."""
        return (
            (e.tenant, e.agent) == (self.tenant, self.agent)
            and (self.session is None or e.session == self.session)
            and self.sees_member(e.user)
            and (self.preview or not e.preview)
            and e.kind in self.kinds
            and (self.before_turn is None or e.turn < self.before_turn)
            and (self.conversation is None or e.execution_id == self.conversation)
            and (self.since_ms is None or e.occurred_ms >= self.since_ms)
            and (self.until_ms is None or e.occurred_ms < self.until_ms)
            and self.bounds_own(e)
        )


def time_window(day: str | None, since: int | None, until: int | None) -> tuple[int | None, int | None]:
    """A UTC `day`, or `since` (inclusive) and `until` (exclusive) in Unix ms.

    Raises ValueError naming the field when they are malformed or conflict.
    """
    if day is not None:
        if since is not None or until is not None:
            raise ValueError("day: give a day, or since and until, not both")
        try:
            d = date.fromisoformat(day)
        except ValueError:
            raise ValueError(f"day: {day!r} is not a UTC date like 2026-09-19") from None
        start = datetime(d.year, d.month, d.day, tzinfo=UTC)
        return int(start.timestamp() * 1000), int((start + timedelta(days=1)).timestamp() * 1000)
    if since is not None and until is not None and until <= since:
        raise ValueError(f"until: {until} must be after since {since}")
    return since, until


def fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def encode_cursor(position: Any, fp: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"p": position, "f": fp}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, fp: str) -> Any:
    """The position a cursor continues from. It only continues the search that made it."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        pos, got = raw["p"], raw["f"]
    except Exception:
        raise ValueError("cursor: not a cursor this API returned") from None
    if got != fp:
        raise ValueError("cursor: it belongs to a different search; pass the same query and filters")
    return pos


def decode_offset(cursor: str, fp: str) -> int:
    """A cursor's position when it is an offset into a list: a whole number from 0. Anything
    else (negative, fractional, infinite, not a number) is refused: a cursor is the caller's."""
    pos = decode_cursor(cursor, fp)
    if type(pos) is not int or pos < 0:
        raise ValueError("cursor: not a cursor this search returned")
    return pos


# ---------------------------------------------------------------------------- membership

# A membership window, [start, end) in Unix ms; None is open (since always, or still a member).
Window = tuple[int | None, int | None]


def _change_key(c: tuple) -> tuple:
    """Changes in log order: by when, then by their place in the turns topic (`order`). At one
    instant the log decides: a join then a leave in the same millisecond is no membership.
    A change stored without its place (before it was kept) sorts first at its instant, a leave
    before a join, as it did then."""
    at, joined = c[0], c[1]
    order = c[2] if len(c) > 2 else None
    return (at, 0, 0, joined) if order is None else (at, 1, order, joined)


def membership_windows(changes: list[tuple]) -> tuple[Window, ...] | None:
    """The windows in which an agent was a member of a session, from its membership changes
    (when, joined, order): `order` is the change's place in the turns topic (None or absent:
    unknown, see `_change_key`). None: no change was ever recorded, so it always was (the
    1:1 case).

    A first change that is a leave means it was a member from the start; changes that do not
    change anything (a join while a member) are ignored.
    """
    if not changes:
        return None
    ordered = sorted(changes, key=_change_key)
    out: list[Window] = []
    start: int | None = None
    member = not ordered[0][1]  # first change a leave: member before it
    for c in ordered:
        at, joined = c[0], c[1]
        if joined and not member:
            start, member = at, True
        elif not joined and member:
            if start is None or at > start:
                out.append((start, at))
            start, member = None, False
    if member:
        out.append((start, None))
    return tuple(out)


def within(windows: tuple[Window, ...] | None, occurred_ms: int) -> bool:
    """Whether a message said at `occurred_ms` is one the agent could see: said while it was a
    member (no windows recorded: always)."""
    if windows is None:
        return True
    return any((s is None or occurred_ms >= s) and (e is None or occurred_ms < e) for s, e in windows)


def encode_change(occurred_ms: int, joined: bool, order: int | None = None) -> str:
    """`ms:joined:order` (`order`: the change's offset in the turns topic)."""
    base = f"{occurred_ms}:{1 if joined else 0}"
    return base if order is None else f"{base}:{order}"


def decode_change(raw: str) -> tuple[int, bool, int | None]:
    """(when, joined, order); a value stored before the order was kept (`ms:joined`) has None."""
    at, _, rest = raw.partition(":")
    j, _, order = rest.partition(":")
    return int(at), j == "1", (int(order) if order else None)


def membership_erased(markers: dict[str, int], tenant: str, agent: str, occurred_ms: int) -> bool:
    """Whether an erasure of the agent or of its whole tenant (no member: everything) that came
    after a membership change reaches it, as `erased` does for events: a replay does not write a
    removed agent's memberships again, and an agent later given the same name starts with none."""
    return any(at is not None and occurred_ms <= at
               for at in (markers.get(erasure_marker(tenant, a, None)) for a in (agent, None)))
