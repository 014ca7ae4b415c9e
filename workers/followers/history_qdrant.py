"""Joins committed turns with their parts' vectors into the history Edge shard, inside the
API process.

An Edge shard belongs to one process, so the process that serves history search owns
the shard and follows `memlane.turns` itself, over every partition, without a
consumer group. It never embeds: the embedding worker embeds each part of a kept event and
puts its vector on the compacted `memlane.history.vectors`, named by the part's point id
(why: docs/decisions/0005-history-bypasses-the-ledger.md). The projection reads that topic too and joins by point id: a
part whose vector has not arrived yet is parked until it does, and a vector read before its
part is held until the part comes.

The checkpoint is a file next to the shard, written after the shard is flushed. It never
passes a turn with a parked part, nor a held vector: either would be lost to a crash. A
restart reads again from the first parked turn, and a part of the turns read before the
crash (`_read`) that the shard holds already is not parked again: its vector went by. A
vector nothing will join (its part was erased, or indexed before a restart) is dropped once
every turn written before it has been read. Deleting the shard and its checkpoint rebuilds
it from the two topics.

A part's text is sealed on the event loop (where a key made for it is published before the
shard is written). The projection follows `memlane.memory.events` too, for `SubjectErased`:
the subject's parts go, parked ones too, and the erasure is remembered in the checkpoint
file (`_erased`), so a turn folded after it, from before it, is not kept again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import structlog
from aiokafka import TopicPartition

from events.codec import PLAIN, Codec, ContractError
from events.lean import decode_lean_vector
from events.memory import SubjectErased
from events.rules.history import KeptEvent, erased, erasure_marker, kept_events
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS, HISTORY_VECTORS, TURNS
from events.turns import MessageDeleted, TurnCommitted
from projections.embedders.port import embedder_model_id
from projections.qdrant.history_index import HistoryIndex, event_parts, pack
from projections.qdrant.index import read_checkpoint, write_checkpoint
from projections.records import Erasure, erasure_at, erasure_of
from settings import Settings
from workers.runtime.follower_poison import FollowerPoison
from workers.runtime.topic_reader import TopicReader, reached, read_so_far, tp_key

log = structlog.get_logger()
FLUSH_EVERY_S = 5.0
ERASED = "_erased"  # the checkpoint file's entry of erasure markers (events.rules.history)
READ = "_read"  # turn partitions read further than their checkpoint: parts there may be indexed

Row = tuple[str, dict[str, Any], str]  # (point id, sealed payload, text)


def history_shard_path(settings: Settings, generation: int = 1) -> Path:
    return Path(settings.data_dir) / "qdrant" / f"history-g{generation}"


@dataclass
class _Turn:
    """A turn read whose parts are not all written yet."""

    parts: int  # parts still waiting
    events: dict[str, int] = field(default_factory=dict)  # event id -> its parts still waiting


@dataclass
class _Part:
    row: Row
    event: KeptEvent
    turn: tuple[str, int]  # (partition, offset) of its turn


@dataclass
class _Batch:
    rows: dict[str, tuple[dict[str, Any], str, Any]] = field(default_factory=dict)  # point id -> (payload, text, vector)
    erasures: list[tuple[Erasure, int]] = field(default_factory=list)
    deleted: list[MessageDeleted] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    poison: list[tuple[str, Any, str]] = field(default_factory=list)  # (source, message, error): to park


class HistoryQdrantProjection:
    def __init__(self, settings: Settings, index: HistoryIndex, keys: Any = None, model_id: str | None = None,
                 *, codec: Codec) -> None:
        self.settings = settings
        self.codec = codec  # opens sealed vectors and seals a parked turn
        self.index = index
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: publishes the keys parts are sealed under first
        # Must match the embedding worker's model id, or no vector ever joins a part.
        self.model_id = model_id or embedder_model_id(settings)
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        self.ckpt: dict[str, int] = read_checkpoint(self.ckpt_path)
        # These two entries of the checkpoint are maps of their own, not offsets.
        self.erased = cast("dict[str, int]", self.ckpt.pop(ERASED, {}))
        self.recheck = cast("dict[str, int]", self.ckpt.pop(READ, {}))
        self.parked: dict[str, list[_Part]] = {}  # point id -> parts waiting for its vector
        self.held: dict[str, tuple[str, int, bytes]] = {}  # point id -> (partition, offset, vector) read first
        # Turns with parked parts, per partition in offset order: the first bounds the checkpoint.
        self.open: dict[str, OrderedDict[int, _Turn]] = {}
        self.turns = 0  # turns whose every part is in the shard
        self.events = 0  # kept events whose every part is in the shard
        self.unreadable = 0  # vectors sealed under destroyed keys
        self.stopping = asyncio.Event()
        self.poison = FollowerPoison(settings, "history-index", codec)
        self.caught_up = asyncio.Event()

    # ------------------------------------------------------------------ joining

    def _remember(self, erasures: list[tuple[Erasure, int]]) -> None:
        for er, at in erasures:
            marker = erasure_marker(er.tenant, er.agent, er.user)
            self.erased[marker] = max(at, self.erased.get(marker, -1))
        if erasures:
            # An erased subject's parked parts go: the embedding worker may never embed them.
            for pid in [pid for pid, ps in self.parked.items() if erased(self.erased, ps[0].event)]:
                for p in self.parked.pop(pid):
                    self._done(p, written=False)

    def _delete(self, d: MessageDeleted, batch: _Batch) -> None:
        """A deleted message's parked parts go unwritten; what the shard holds of it goes when
        the batch is written, after its rows (a deletion follows the turn that said it)."""
        def said(e: KeptEvent) -> bool:
            return (e.id, e.session, e.agent, e.tenant) == (d.message_id, d.session, d.agent, d.tenant)

        for pid in [pid for pid, ps in self.parked.items() if said(ps[0].event)]:
            for p in self.parked.pop(pid):
                self._done(p, written=False)
        batch.deleted.append(d)

    def _done(self, p: _Part, written: bool = True) -> None:
        """One parked part is written (or needs no writing): its turn and event count down."""
        part, offset = p.turn
        turn = self.open[part][offset]
        turn.parts -= 1
        turn.events[p.event.id] -= 1
        if turn.events[p.event.id] == 0:
            del turn.events[p.event.id]
            self.events += written
        if turn.parts == 0:
            del self.open[part][offset]
            self.turns += 1

    def _on_vector(self, key: bytes | None, value: bytes | None, part: str, offset: int) -> list[str]:
        """Holds a part's vector until it is joined (`_joining`); returns its point id."""
        if key is None:
            return []  # not a part's vector: the topic is keyed "model/point id"
        model, _, pid = key.decode().rpartition("/")
        if model != self.model_id:
            return []
        if value is None:  # a tombstone: the vector of an erased subject
            self.held.pop(pid, None)
            return []
        self.held[pid] = (part, offset, value)
        return [pid]

    def _join(self, pid: str, batch: _Batch, final: bool = False) -> None:
        """Writes the parked part `pid` with its held vector, if the vector opens."""
        vec = self._vector(pid, final)
        if vec is None:
            return
        parts = self.parked.pop(pid)
        if vec is not False:
            _, stored, text = parts[-1].row
            batch.rows[pid] = (stored, text, vec)
        for p in parts:
            self._done(p, written=vec is not False)

    def _vector(self, pid: str, final: bool = False) -> Any:
        """The held vector of `pid`, opened: None when it is bad (the part waits for a good
        one), False when it is sealed under a destroyed key (the part is never written).
        Raises `KeyMissing` for a key not known here yet, leaving the vector held, unless
        `final` (a second try, after catching up: the key was destroyed)."""
        _, _, value = self.held[pid]
        try:
            msg = decode_lean_vector(value)
            if (msg.model, msg.content_hash) != (self.model_id, pid):
                raise ContractError("content_hash", f"the message key names {self.model_id}/{pid}, the value "
                                    f"{msg.model}/{msg.content_hash}")
            vec = msg.floats(self.codec.cipher)
        except ContractError as err:
            log.warning("history_skipped_vector", point=pid, error=str(err))  # the embedding worker's to fix
            del self.held[pid]
            return None
        except (KeyDestroyed, KeyMissing) as err:
            if isinstance(err, KeyMissing) and not final:
                raise
            self.unreadable += 1
            del self.held[pid]
            return False
        del self.held[pid]
        return vec

    def _on_turn(self, turn: TurnCommitted, part: str, offset: int) -> list[str]:
        """Parks the turn's parts that no erasure reaches (`_joining` joins those whose
        vector is held); returns their point ids."""
        rows = [(e, pid, payload) for e in kept_events(turn) if not erased(self.erased, e)
                for pid, payload in event_parts(e)]
        if not rows:
            self.turns += 1
            return []
        t = _Turn(parts=len(rows))
        for e, _, _ in rows:
            t.events[e.id] = t.events.get(e.id, 0) + 1
        self.open.setdefault(part, OrderedDict())[offset] = t
        for e, pid, payload in rows:
            self.parked.setdefault(pid, []).append(_Part((pid, pack(payload, self.index.cipher), payload["text"]), e, (part, offset)))
        return [pid for _, pid, _ in rows]

    def _indexed(self, pids: set[str]) -> None:
        """Parts of turns read again after a restart that the shard holds already: done."""
        for pid in pids:
            for p in self.parked.pop(pid, []):
                self._done(p)

    def _write(self, batch: _Batch) -> None:
        for er, _ in batch.erasures:
            self.index.purge(er)
        self.index.upsert_packed([(pid, stored, text, vec) for pid, (stored, text, vec) in batch.rows.items()])
        for d in batch.deleted:
            self.index.delete_message(d.tenant, d.agent, d.session, d.message_id)

    # ------------------------------------------------------------------ checkpoint

    def checkpoint(self) -> dict[str, Any]:
        """What a restart may resume from: each turn partition held back to its first turn
        with a parked part, each vector partition to its first held vector."""
        out: dict[str, Any] = dict(self.ckpt)
        for part, turns in self.open.items():
            if turns:
                out[part] = min(out[part], next(iter(turns)))
        for part, offset, _ in self.held.values():
            out[part] = min(out[part], offset)
        read = {}
        for part in self.open.keys() | self.recheck.keys():
            furthest = max(self.ckpt.get(part, 0), self.recheck.get(part, 0))
            if out.get(part, 0) < furthest:
                read[part] = furthest
        return {**out, READ: read, ERASED: self.erased}

    def _save_checkpoint(self, ckpt: dict[str, Any]) -> None:
        self.index.flush()
        write_checkpoint(self.ckpt_path, ckpt)

    # ------------------------------------------------------------------ the loop

    def _take(self, tp: TopicPartition, m: Any, topics: dict[str, str], batch: _Batch) -> list[str]:
        """One message read; returns the point ids of the parts or vector it brought."""
        part, kind = tp_key(tp), topics[tp.topic]
        if kind == HISTORY_VECTORS.name:
            return self._on_vector(m.key, m.value, part, m.offset)
        if self.poison.for_another(m):
            return []
        try:
            if kind == EVENTS.name:
                ev = erasure_of(EVENTS.name, m.value) if m.value else None
            else:
                ev = PLAIN.decode(TURNS.name, m.value)  # the platform's turns are plaintext
        except ContractError as err:
            batch.poison.append((kind, m, str(err)))
            return []
        if isinstance(ev, SubjectErased):
            batch.erasures.append(erasure_at(ev))
            # Remembered at once: a turn later in this batch from before it is not kept.
            self._remember(batch.erasures[-1:])
        elif isinstance(ev, TurnCommitted):
            return self._on_turn(ev, part, m.offset)
        elif isinstance(ev, MessageDeleted):
            self._delete(ev, batch)
        return []

    async def _joining(self, pids: list[str], batch: _Batch) -> None:
        """Joins parked parts with held vectors; a vector sealed under a key this process has
        not learned yet waits for it (caught up once), else counts as destroyed."""
        for pid in pids:
            if pid not in self.parked or pid not in self.held:
                continue
            try:
                self._join(pid, batch)
            except KeyMissing:
                if self.keys is not None:
                    await self.keys.catch_up()
                self._join(pid, batch, final=True)

    async def run(self, until_caught_up: bool = False, progress: Callable[[int, int], None] | None = None) -> None:
        try:
            await self._fold(until_caught_up, progress)
        finally:
            await self.poison.aclose()

    async def _fold(self, until_caught_up: bool, progress: Callable[[int, int], None] | None) -> None:
        s = self.settings
        topics = {s.topic(t.name): t.name for t in (TURNS, EVENTS, HISTORY_VECTORS)}
        turn_tps = [TopicPartition(s.topic(TURNS.name), p) for p in range(TURNS.partitions)]
        watch = turn_tps + [TopicPartition(s.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        vector_tps = [TopicPartition(s.topic(HISTORY_VECTORS.name), p) for p in range(HISTORY_VECTORS.partitions)]
        async with TopicReader(s) as c:
            await c.assign(watch + vector_tps, self.ckpt)
            end = await c.ends(watch)
            total = sum(end.values())
            dirty, last_flush = False, time.monotonic()
            while not self.stopping.is_set():
                batch = _Batch()
                touched: list[str] = []
                for tp, msgs in (await c.poll(timeout_ms=200, max_records=1000)).items():
                    for m in msgs:
                        touched += self._take(tp, m, topics, batch)
                        batch.positions[tp_key(tp)] = m.offset + 1
                for source, m, error in batch.poison:
                    await self.poison.park(source, m, error)
                if batch.positions:
                    # Joined once the whole poll is taken: its erasures have dropped what they reach.
                    await self._joining(touched, batch)
                    if lookup := [pid for pid in touched if pid in self.parked and self._rechecking(pid)]:
                        self._indexed(await asyncio.to_thread(self.index.held, lookup))
                    if self.keys is not None and batch.rows:
                        await self.keys.flush()  # the keys the parts are sealed under go out before the shard has them
                    await asyncio.to_thread(self._write, batch)
                    self.ckpt.update(batch.positions)
                    dirty = True
                pos = await c.positions(watch)
                done = reached(pos, end)
                if self.held and not self._behind(c, pos, turn_tps) and await c.read_to_end(turn_tps):
                    # Every turn written before these vectors has been read: none will join.
                    self.held.clear()
                # Flushing is what makes a checkpoint safe, and it is costly (it grows with the
                # shard; figures: docs/decisions/0004-qdrant-edge-embedded-index.md), so it runs every few seconds,
                # not on each pause of the stream; a crash replays those seconds' turns, which
                # upsert the same point ids.
                if dirty and time.monotonic() - last_flush > FLUSH_EVERY_S:
                    await asyncio.to_thread(self._save_checkpoint, self.checkpoint())
                    dirty, last_flush = False, time.monotonic()
                if progress:
                    progress(read_so_far(pos, end), total)
                # Caught up once every turn read is in, or waits for a vector not yet written.
                if done and not self.caught_up.is_set() and (not self.parked or await c.read_to_end(vector_tps)):
                    self.caught_up.set()
                    log.info("history_projection_caught_up", points=self.index.count(), turns=self.turns,
                             parked=len(self.parked))
                    if until_caught_up:
                        break
            if dirty:
                await asyncio.to_thread(self._save_checkpoint, self.checkpoint())

    def _rechecking(self, pid: str) -> bool:
        part, offset = self.parked[pid][0].turn
        return offset < self.recheck.get(part, 0)

    @staticmethod
    def _behind(c: TopicReader, pos: dict[TopicPartition, int], tps: list[TopicPartition]) -> bool:
        return any(pos[tp] < (c.last_stable_offset(tp) or 0) for tp in tps)

    def status(self) -> dict[str, Any]:
        return {
            "points": self.index.count(),
            "turns": self.turns,
            "events": self.events,
            "parked": sum(len(ps) for ps in self.parked.values()),
            "caught_up": self.caught_up.is_set(),
        }
