"""Notes' read-side rules (docs/features/notes.md), pure: which messages a save names, whether a note
may be shown given which of its sources the caller can see now, and how notes rank against a
text (recall's and a search's).

The ledger's rules (revisions, who writes) are `events.rules.ledger.notes`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from events.rules.history import reachable

Ref = tuple[str, str]  # (conversation, message id)

RECALLED = 10  # notes a recall shows at most
# Words too common to say what a note is about.
_STOP = frozenset(
    "a an and are as at be but by for from has have he her his i if in is it its me my no not of on or our she so "
    "that the their them then there these they this to was we were what when where which who will with you your "
    "de la le el en et".split())
_WORD = re.compile(r"\w+")


class SourceError(ValueError):
    """A source a save may not cite: `index` is its place in `source_messages`."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"source_messages.{index}: {message}")
        self.index, self.message = index, message

    @property
    def field(self) -> str:
        return f"source_messages.{self.index}"


def resolve_sources(sources: Sequence[str | Mapping[str, Any]], session: str | None, across: bool) -> dict[Ref, int]:
    """The (conversation, message id) each source names, in order, once each, with the index of
    its first citation in `sources` (what an error names): a message id is a message of the
    caller's session (`session`, X-Session); `{"conversation", "id"}` one of another session of
    the agent, which only `across` (history across conversations) allows. Raises `SourceError`
    for the first source it cannot take."""
    out: dict[Ref, int] = {}
    for i, s in enumerate(sources):
        if isinstance(s, str):
            if session is None:
                raise SourceError(i, "a message id names a message of this session, and the call names none; "
                                  "send X-Session, or name the conversation ({\"conversation\", \"id\"})")
            ref = (session, s)
        else:
            ref = (s["conversation"], s["id"])
            if not reachable(ref[0], session, across):
                raise SourceError(i, f"conversation {ref[0]} is not this session, and history across "
                                  "conversations is off for this agent (history.across_conversations); cite "
                                  "messages of this session")
        out.setdefault(ref, i)
    return out


def shown(sources: Iterable[Ref], home: str | None, visible: Mapping[Ref, Any] | set[Ref], across: bool) -> bool:
    """Whether a note may be shown: the caller can see every one of its sources now (none was
    deleted, erased or hidden from it since), and its sources outside the session it was saved
    from (`home`) are still reachable (history across conversations still on)."""
    return all(ref in visible and reachable(ref[0], home, across) for ref in sources)


def words(text: str) -> frozenset[str]:
    """The words a note or a text is about: lower case, without the most common ones."""
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1)


@dataclass(frozen=True)
class Scored:
    note: Any
    score: int


def rank(notes: Iterable[Any], text: str) -> list[Any]:
    """Notes (with `topic`, `summary`, `saved_at`, `id`) that share a word with `text`, most shared
    words first (a topic's words count twice: the topic says what the note is about), then the
    most recently saved; the rest are left out."""
    asked = words(text)
    if not asked:
        return []
    scored = []
    for n in notes:
        score = 2 * len(asked & words(n.topic)) + len(asked & words(n.summary))
        if score:
            scored.append(Scored(n, score))
    scored.sort(key=lambda s: (-s.score, -_ts(s.note.saved_at), s.note.id))
    return [s.note for s in scored]


def newest(notes: Iterable[Any]) -> list[Any]:
    """Notes newest saved first (a listing without a query)."""
    return sorted(notes, key=lambda n: (-_ts(n.saved_at), n.id))


def _ts(at: datetime) -> float:
    return at.timestamp()
