"""The join of memory events with their vectors, by content hash, in the Qdrant projection.

A record whose vector has not arrived yet is parked until it does, and the checkpoint is
kept behind its event meanwhile; a vector read before its event is held (`VectorCache`). A
record's versions only move forward: a duplicate or an older version read again changes
nothing. After a restart, a range read before it is applied again only at the offsets that
were parked then (`redo`): the others are in the index already.
"""

from __future__ import annotations

import array
import sys
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from events.base import command_key
from events.lean import LeanEvent, LeanRecord, decode_lean, decode_lean_vector
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import REDELIVERED
from projections.qdrant.index import RecordKey, indexable
from workers.followers.qdrant_batch import Batch
from workers.followers.qdrant_vectors import VectorCache

# Another view folded from the same pass over the events: its events, and the checkpoint
# positions they take it to.
Also = Callable[[list[LeanEvent], list[tuple[str, int]]], Awaitable[None]]


class Join(VectorCache):
    """The join part of `QdrantProjection`, which sets this state up."""

    # content hash -> {record: (record, event)} waiting for that vector. Records are
    # keyed by tenant, agent and id: two agents may hold equal record ids.
    parked: dict[str, dict[RecordKey, tuple[LeanRecord, LeanEvent]]]
    parked_at: dict[RecordKey, tuple[str, str, int]]  # -> (content hash, partition, offset)
    parked_commands: Counter[str]  # command_key -> its events still parked
    # Offsets of parked events the checkpoint must not pass, per partition, in log order (so
    # the first is the lowest).
    held_events: dict[str, OrderedDict[int, None]]
    versions: dict[RecordKey, int]  # the latest version of each record seen
    # partition -> (read position, offsets to apply again) after a restart.
    redo: dict[str, tuple[int, set[int]]]
    also: Also | None

    def parked_count(self) -> int:
        return sum(len(b) for b in self.parked.values())

    def parked_version(self, rk: RecordKey) -> int | None:
        at = self.parked_at.get(rk)
        return None if at is None else self.parked[at[0]][rk][0].version

    def _take(self, m: Any, is_vector: bool, batch: Batch, part: str, final: bool = False) -> None:
        """One message read. Raises `KeyMissing` (unless `final`) before it changes anything."""
        if is_vector:
            self._on_vector(m.key, m.value, batch, part, m.offset, final)
            return
        event = decode_lean(m.value)
        copy = (REDELIVERED, b"1") in (m.headers or ())
        # A retry (`final`) follows a first try that was applying the event: `_redone` said so then.
        if copy or (not final and self.redo and not self._redone(part, m.offset)):
            batch.done.append(event)  # applied at its original offset, or before a restart
        else:
            self._on_event(event, batch, part, m.offset, final)
        if self.also:
            # A rebuild's Redis fill skips copies too (see `decode_logged`), and still moves
            # its checkpoint past them.
            if not copy:
                batch.events.append(event)
            batch.event_positions.append((part, m.offset + 1))

    def _on_vector(self, key: bytes | None, value: bytes | None, batch: Batch, part: str, offset: int,
                   final: bool = False) -> None:
        """`final`: a key still not known is taken as destroyed (a second try, after catching up)."""
        held: array.array | bytes | None
        if key is None:  # the topic is keyed "model/hash"; a keyless message says so itself
            if value is None:
                return
            msg = decode_lean_vector(value)
            model, h, held = msg.model, msg.content_hash, msg.floats(self.codec.cipher)
        else:
            model, _, h = key.decode().rpartition("/")
            held = value
        if model != self.model_id:
            return
        if held is None:  # a tombstone: the vector of an erased subject
            self.vectors.pop(h, None)
            if (prev := self.unused.pop(h, None)) is not None:
                self.held_vectors[prev[0]].pop(prev[1], None)
            return
        self.vectors[h] = held
        self.vectors.move_to_end(h)
        if h not in self.parked:
            self._hold_vector(h, part, offset)  # its event is still ahead in the log
            return
        vec = self._vector(h, final)
        if vec is None:
            return
        waiting = self.parked.pop(h)
        for rk, (r, event) in waiting.items():
            _, at, off = self.parked_at.pop(rk)
            self.held_events[at].pop(off, None)
            self._unpark(event)
            batch.upserts[rk] = (r, vec)
            batch.done.append(event)

    def _on_event(self, e: LeanEvent, batch: Batch, part: str, offset: int, final: bool = False) -> None:
        """Raises `KeyMissing` before it changes anything (the caller catches up on the keys
        and calls again with `final`, when a key still not known is taken as destroyed).
        Purges are another part's (`Purges._on_event`)."""
        r = e.record
        if r is None:
            batch.done.append(e)
            return
        # Interned: `versions` keeps a key per record, and every decoded record holds its own
        # copy of the tenant and agent strings (~100 bytes a record for nothing).
        rk = (sys.intern(r.tenant), sys.intern(r.agent), r.id)
        if r.version <= self.versions.get(rk, 0):
            batch.done.append(e)  # a duplicate or an older version: already reflected
            return
        opened, h, vec = None, "", None
        if indexable(r):
            try:
                opened, h, _ = r.vector_of(self.codec.cipher)
            except KeyMissing:
                if not final:
                    raise
                self.unreadable += 1
            except KeyDestroyed:
                self.unreadable += 1  # an erased subject's: no point
            if opened is not None:
                vec = self._vector(h, final)
        self.versions[rk] = r.version
        if rk in self.parked_at:  # a newer version replaces one still waiting for its vector
            stale = self._drop_parked(rk)
            if stale is not None:
                batch.done.append(stale[1])
        batch.upserts.pop(rk, None)
        batch.deletes.discard(rk)
        if r.preview and r.replaces:
            batch.shadows.append((r.tenant, r.agent, r.replaces))
        if opened is None:
            batch.deletes.add(rk)
            batch.done.append(e)
            return
        if (held := self.unused.pop(h, None)) is not None:
            self.held_vectors[held[0]].pop(held[1], None)
        if vec is None:
            self.parked.setdefault(h, {})[rk] = (opened, e)
            self.parked_at[rk] = (h, part, offset)
            self.held_events.setdefault(part, OrderedDict())[offset] = None
            self.parked_commands[command_key(e.tenant, e.agent, e.command_id)] += 1
            return
        batch.upserts[rk] = (opened, vec)
        batch.done.append(e)

    def _drop_parked(self, rk: RecordKey) -> tuple[LeanRecord, LeanEvent] | None:
        """Stop waiting for record `rk`'s vector; returns what was parked."""
        h, part, offset = self.parked_at.pop(rk)
        self.held_events[part].pop(offset, None)
        waiting = self.parked.get(h, {})
        item = waiting.pop(rk, None)
        if not waiting:
            self.parked.pop(h, None)
        if item is not None:
            self._unpark(item[1])
        return item

    def _unpark(self, event: LeanEvent) -> None:
        key = command_key(event.tenant, event.agent, event.command_id)
        self.parked_commands[key] -= 1
        if self.parked_commands[key] <= 0:
            del self.parked_commands[key]

    def _redone(self, part: str, offset: int) -> bool:
        """Whether the event at `offset` is to be applied, in a range read before a restart:
        only the events parked then are, the others are in the index already (and their
        vectors may be behind the vectors' checkpoint)."""
        redo = self.redo.get(part)
        if redo is None:
            return True
        end, offsets = redo
        if offset >= end:
            del self.redo[part]
            return True
        if offset in offsets:
            offsets.discard(offset)
            return True
        return False
