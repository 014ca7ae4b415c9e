"""Redis adapter of the note view (docs/features/notes.md).

Each identity's notes are one hash in the record view's generation namespace,
`notes:{<tenant>/<agent>}|<user>` (`<user>` empty for the agent's own notes; the agent's hash tag,
so it shares the agent's slot): field `<note id>` holds the note's last `NoteSaved` as logged (its
topic and summary sealed under the owner's key, as the log holds them). `NoteForgotten` removes
the field. The redis-projection worker folds both (`fold`) in the same pass as the records, before
the checkpoint, so a rebuild fills the view from the log too; folding a batch again in log order
leaves the same hash. `SubjectErased` drops what it reaches (`purge`): a member's notes with the
member, every note of an agent with the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from events.codec import Codec
from events.sealing import KeyDestroyed, KeyMissing
from projections.records import Erasure, opening
from projections.redis.connection import agent_tag, scan_keys, unlink_keys
from projections.redis.view_store import ViewStore

NOTE_EVENTS = ("NoteSaved", "NoteForgotten")
PAGE = 1000


class _NoteFields(msgspec.Struct, kw_only=True):
    """The fields of a note event the view keys by: never sealed, so read without opening."""

    type: str
    tenant: str
    agent: str
    note_id: str
    user: str | None = None


class _Source(msgspec.Struct, frozen=True):
    conversation: str
    id: str


class _Saved(msgspec.Struct, kw_only=True):
    """A `NoteSaved` as the view reads it, once opened."""

    note_id: str
    user: str | None = None
    revision: int
    topic: str = ""
    summary: str = ""
    sources: list[_Source] = []
    session: str | None = None
    occurred_at: datetime


_FIELDS = msgspec.json.Decoder(_NoteFields, strict=False)
_SAVED = msgspec.json.Decoder(_Saved, strict=False)


def notes_key(ns: str, tenant: str, agent: str, user: str | None) -> str:
    return f"{ns}:notes:{agent_tag(f'{tenant}/{agent}')}|{user or ''}"


def fold(pipe: Any, ns: str, raw: bytes | str) -> None:
    """Queues on `pipe` what a logged note event changes."""
    f = _FIELDS.decode(raw)
    key = notes_key(ns, f.tenant, f.agent, f.user)
    if f.type == "NoteSaved":
        pipe.hset(key, f.note_id, raw)
    else:
        pipe.hdel(key, f.note_id)


async def purge(client: Any, ns: str, er: Erasure) -> None:
    """Drops the notes an erasure reaches. Walks the keyspace for an agent's or a tenant's
    notes (no set names their owners): an erasure is rare."""
    if er.agent is not None and er.user is not None:
        await client.unlink(notes_key(ns, er.tenant, er.agent, er.user))
        return
    match = f"{ns}:notes:{agent_tag(f'{er.tenant}/{er.agent}')}|*" if er.agent is not None else \
        f"{ns}:notes:{{{er.tenant}/*"
    keys = [k async for k in scan_keys(client, match, count=PAGE)]
    if er.user is not None:  # one member on every agent of the tenant
        keys = [k for k in keys if k.endswith(f"}}|{er.user}")]
    await unlink_keys(client, keys, PAGE)


@dataclass(frozen=True)
class Note:
    """A note as the view holds it: its sources as (conversation, message id)."""

    id: str
    revision: int
    topic: str
    summary: str
    sources: tuple[tuple[str, str], ...]
    session: str | None
    saved_at: datetime
    user: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "revision": self.revision, "topic": self.topic, "summary": self.summary,
                "source_messages": [{"conversation": c, "id": m} for c, m in self.sources],
                "conversation": self.session, "saved_at": self.saved_at.isoformat()}


def _note(raw: bytes | str, codec: Codec) -> Note:
    """Raises `KeyMissing` or `KeyDestroyed` for a note it cannot open."""
    d = _SAVED.decode(codec.opened(raw))
    return Note(d.note_id, d.revision, d.topic, d.summary, tuple((s.conversation, s.id) for s in d.sources),
                d.session, d.occurred_at, d.user)


class NoteView:
    """Reads of the note view, over the record view's client and generation."""

    def __init__(self, records: ViewStore) -> None:
        self.records = records

    async def _key(self, tenant: str, agent: str, user: str | None) -> str:
        rec = self.records
        return notes_key(await rec.namespace(), tenant, agent, user)

    async def _opened(self, raw: bytes | str) -> Note | None:
        try:
            return await opening(self.records.keys, _note, raw, self.records.codec)
        except (KeyMissing, KeyDestroyed):  # no keys to catch up with: unreadable here
            return None

    async def get(self, tenant: str, agent: str, user: str | None, note_id: str) -> Note | None:
        raw = await self.records.r.hget(await self._key(tenant, agent, user), note_id)
        return await self._opened(raw) if raw else None

    async def revision(self, tenant: str, agent: str, user: str | None, note_id: str) -> int:
        """The note's revision as the view shows it, without opening it (0: none)."""
        raw = await self.records.r.hget(await self._key(tenant, agent, user), note_id)
        if not raw:
            return 0
        return msgspec.json.decode(raw, type=_Revision).revision

    async def all(self, tenant: str, agent: str, user: str | None) -> list[Note]:
        """Every note of the identity that opens, in no particular order: one round trip."""
        stored = await self.records.r.hgetall(await self._key(tenant, agent, user))
        out = []
        for raw in stored.values():
            if (n := await self._opened(raw)) is not None:
                out.append(n)
        return out


class _Revision(msgspec.Struct):
    revision: int
