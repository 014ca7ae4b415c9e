"""Folds memory events, joined with their vectors, into the Qdrant index.

In the embedded default the process that serves search owns the Edge shards, so it runs
one of these projections per shard, each over its shard's event partitions (Kafka
Streams' interactive-queries pattern; see `workers.followers.memory_shards`). It reads the
`memlane.vectors` partitions beside its agents (`events.topics.vector_partition`) and
joins them with the events by content hash: a record whose vector has not arrived yet
is parked until it does. It never embeds.
The checkpoint is a file next to the shard, written after the shard is flushed. It never
passes an event still parked, nor a vector read before its event: each would be lost
to a crash. It lists the parked events' offsets, so a restart applies those again and
skips the events between them that were already applied.

Records and vectors are sealed (`events.sealing`): a record is opened to be indexed, and
one sealed under a destroyed key is counted (`unreadable`) and is no point. A vector's
content hash is keyed by its subject's data key (`LeanRecord.vector_of`). `SubjectErased`
removes the subject's points; one that reaches every agent of a tenant (a member on all of
them, or the tenant) is carried by one shard's partitions, which purges its peers too (the
other shards of its process) and saves no checkpoint past it until they have flushed.
"""

from __future__ import annotations

import array
import asyncio
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog
from aiokafka import TopicPartition

from events.base import command_key
from events.codec import ContractError
from events.lean import LeanEvent, LeanRecord, decode_lean, decode_lean_vector
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS, REDELIVERED, REPLIES, VECTORS, vector_partitions
from projections.embedding_port import embedder_model_id
from projections.qdrant_index import EdgeIndex, RecordKey, indexable, read_checkpoint, write_checkpoint
from projections.records import Erasure
from settings import Settings
from workers.runtime.faults import INDEX_CHECKPOINT_WITH_PARKED, Faults
from workers.runtime.heap import settle_heap
from workers.runtime.topic_reader import TopicReader, reached, read_so_far, tp_key

if TYPE_CHECKING:
    from projections.qdrant_client_index import ClientIndex

log = structlog.get_logger()
Also = Callable[[list[LeanEvent], list[tuple[str, int]]], Awaitable[None]]
LIVE_FLUSH_S = 5.0
VECTOR_CACHE = 50_000  # vectors kept as read (about 2.2 KB each) by a serving process
INLINE_WRITES = 32  # points; more go to a worker thread while serving
PARKED, READ = "_parked", "_read"  # checkpoint entries besides the `topic:partition` positions
PURGES = ("SubjectErased", "RecordsPurged")
Heal = tuple[asyncio.Future, list[tuple[LeanRecord, Any]], list[tuple[RecordKey, int]], set[RecordKey]]


class QdrantProjection:
    def __init__(
        self,
        settings: Settings,
        index: EdgeIndex | ClientIndex,  # the vector-index port: either adapter
        partitions: list[int] | None = None,
        model_id: str | None = None,
        vector_cache: int | None = VECTOR_CACHE,
        serving: bool = True,
        also: Also | None = None,
        keys: Any = None,
    ) -> None:
        self.settings = settings
        self.faults = Faults(settings.fault_at)
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: caught up on when a key is not known yet
        self.unreadable = 0  # records and vectors sealed under destroyed keys, skipped
        # The other shards of this process: an erasure of every agent of a tenant reaches them.
        self.peers: list[QdrantProjection] = []
        self.purges: list[tuple[asyncio.Future, Erasure]] = []  # queued by a peer
        self.awaiting: list[asyncio.Future] = []  # peers' purges a saved checkpoint waits for
        self.erased_everywhere: list[Erasure] = []  # seen here: a replay applies them to every shard
        self.running = False
        self.index = index
        # The event partitions whose records this index holds (a shard's; all by default).
        self.partitions = list(range(EVENTS.partitions)) if partitions is None else partitions
        # Serving searches too: large writes go to a worker thread, so the event loop gets a
        # turn between Edge calls; a rebuild and small writes stay inline (docs/decisions/0004-qdrant-edge-embedded-index.md).
        self.serving = serving
        # Another view folded from the same pass over the events, each batch with its
        # checkpoint positions: a rebuild's shard process also fills its agents' Redis
        # records, so each event is read and decoded once.
        self.also = also
        # Must match the embedder's model id, or no vector ever joins a record.
        self.model_id = model_id or embedder_model_id(settings)
        self.vector_cache = vector_cache  # None: keep every vector (a rebuild reads them all first)
        self._bound = vector_cache
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        # Positions read and written to the index (the saved checkpoint may be behind them);
        # `redo`: partition -> (read position, offsets to apply again) after a restart.
        self.ckpt, self.redo = load_checkpoint(self.ckpt_path)
        # Events before these are in the index without this process having read them.
        self.started = {k: max(v, self.redo[k][0] if k in self.redo else 0) for k, v in self.ckpt.items()}
        # Vectors are kept as read and decoded when a record joins one: a partition can hold
        # vectors of other shards' agents (when the shard count does not divide the vector
        # partitions) and of texts no live record has any more.
        self.vectors: OrderedDict[str, array.array | bytes] = OrderedDict()
        # content hash -> {record: (record, event)} waiting for that vector. Records are
        # keyed by tenant, agent and id: two agents may hold equal record ids.
        self.parked: dict[str, dict[RecordKey, tuple[LeanRecord, LeanEvent]]] = {}
        self.parked_at: dict[RecordKey, tuple[str, str, int]] = {}  # -> (content hash, partition, offset)
        self.parked_commands: Counter[str] = Counter()  # command_key -> its events still parked
        # Vectors read before their event (content hash -> partition, offset): never
        # evicted, so no record is stranded.
        self.unused: dict[str, tuple[str, int]] = {}
        # Offsets the checkpoint must not pass, per partition, in log order (so the first is
        # the lowest): parked events, and vectors read before their event.
        self.held_events: dict[str, OrderedDict[int, None]] = {}
        self.held_vectors: dict[str, OrderedDict[int, None]] = {}
        self.versions: dict[RecordKey, int] = {}
        self.heals: list[Heal] = []
        self._answering: set[asyncio.Task] = set()
        self.waiters: dict[str, list[asyncio.Future]] = {}
        self.done_commands: OrderedDict[str, list[LeanEvent]] = OrderedDict()
        # The ledger's answers to a command it had decided before (`REPLIES`), each with the
        # event offset of its partition the projection must have applied first: (events' partition
        # key, that offset, the answer's event).
        self.replies: list[tuple[str, int, LeanEvent]] = []
        self.replying: set[str] = set()  # commands an answer, not their first events, is answering
        # Per events partition, the position every message before which is applied here; unlike
        # a checkpoint, it moves past transactions' commit markers, as a partition's end does.
        self.applied_to: dict[str, int] = {}
        self.applied = 0
        self.stopping = asyncio.Event()
        self.caught_up = asyncio.Event()

    # ------------------------------------------------------------------ read-your-writes

    def wait_for(self, command_id: str, tenant: str, agent: str) -> asyncio.Future:
        """Resolves with the command's (full) events once they are searchable. Call it
        before sending the command: only commands someone waits for are tracked. Keyed by
        tenant and agent too: two agents may send the same command id."""
        key = command_key(tenant, agent, command_id)
        fut = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(key, []).append(fut)
        fut.add_done_callback(lambda f: self._drop_waiter(key, f) if f.cancelled() else None)
        return fut

    def _drop_waiter(self, cid: str, fut: asyncio.Future) -> None:
        """A caller gave up (timed out): drop its waiter and, if it was the last, the command."""
        left = [f for f in self.waiters.get(cid, []) if f is not fut]
        if left:
            self.waiters[cid] = left
        else:
            self.waiters.pop(cid, None)
            self.done_commands.pop(cid, None)
            self.replying.discard(cid)

    def _complete(self, cid: str) -> bool:
        """A command is done once its last event is in and none of its events is parked."""
        events = self.done_commands.get(cid)
        return bool(events) and not self.parked_commands[cid] and any(e.last for e in cast("list[LeanEvent]", events))

    def _command_done(self, event: LeanEvent) -> None:
        cid = command_key(event.tenant, event.agent, event.command_id)
        if cid not in self.waiters:
            return
        self.done_commands.setdefault(cid, []).append(event)
        while len(self.done_commands) > 50_000:
            self.done_commands.popitem(last=False)
        if self._complete(cid):
            done, futs = self.done_commands.pop(cid), self.waiters.pop(cid)
            try:
                events = [e.full() for e in done]
            except (KeyMissing, KeyDestroyed, ContractError) as err:
                self._answer_later(done, futs, err)
                return
            for fut in futs:
                if not fut.done():
                    fut.set_result(events)

    async def _take_replies(self, c: TopicReader, tp: TopicPartition, msgs: list[Any]) -> None:
        """The ledger's answers read: each waits until this projection has applied every event
        committed when the answer was read (its command's first events among them: committed in
        the same transaction or before), so an answer never comes before what it says was written."""
        events_tp = TopicPartition(self.settings.topic(EVENTS.name), tp.partition)
        waited = []
        for m in msgs:
            try:
                event = decode_lean(m.value)
            except ContractError as err:
                log.warning("projection_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                continue
            if command_key(event.tenant, event.agent, event.command_id) in self.waiters:
                waited.append(event)
        if waited:
            need = (await c.ends([events_tp]))[events_tp]  # asked now: a position fetched earlier may be older
            self.replies += [(tp_key(events_tp), need, e) for e in waited]

    def _answer_replies(self) -> None:
        """Answers whose events are applied here resolve their waiters, as the events themselves
        would have; a waiter the first events already answer (it waited before they came) keeps
        theirs."""
        left = []
        for part, need, event in self.replies:
            cid = command_key(event.tenant, event.agent, event.command_id)
            if cid not in self.waiters or (cid in self.done_commands and cid not in self.replying):
                continue  # nobody waits, or the command's first events are answering
            if self.applied_to.get(part, 0) < need or self.parked_commands[cid]:
                left.append((part, need, event))
                continue
            self.replying.add(cid)
            self._command_done(event)
            if cid not in self.waiters:
                self.replying.discard(cid)
        self.replies = left

    def _answer_later(self, done: list[LeanEvent], futs: list[asyncio.Future], err: Exception) -> None:
        """A waiter's events sealed under a key this process has not learned yet: caught up on
        in the background (the loop goes on), then opened for it."""
        async def answer() -> None:
            try:
                if isinstance(err, KeyMissing) and self.keys is not None:
                    await self.keys.catch_up()
                events = [e.full() for e in done]
            except Exception as e:
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(e)
                return
            for fut in futs:
                if not fut.done():
                    fut.set_result(events)

        task = asyncio.get_running_loop().create_task(answer())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    # ------------------------------------------------------------------ folding

    def _on_vector(self, key: bytes | None, value: bytes | None, batch: _Batch, part: str, offset: int,
                   final: bool = False) -> None:
        """`final`: a key still not known is taken as destroyed (a second try, after catching up)."""
        held: array.array | bytes | None
        if key is None:  # the topic is keyed "model/hash"; a keyless message says so itself
            if value is None:
                return
            msg = decode_lean_vector(value)
            model, h, held = msg.model, msg.content_hash, msg.floats()
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

    def _on_event(self, e: LeanEvent, batch: _Batch, part: str, offset: int, final: bool = False) -> None:
        """Raises `KeyMissing` before it changes anything (the caller catches up on the keys
        and calls again with `final`, when a key still not known is taken as destroyed)."""
        if e.type in PURGES:
            self._on_purge(e, batch)
            batch.done.append(e)
            return
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
                opened, h, _ = r.vector_of()
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

    # ------------------------------------------------------------------ purges

    def _on_purge(self, e: LeanEvent, batch: _Batch) -> None:
        if e.type == "RecordsPurged":
            for rid in e.record_ids:
                rk = (e.tenant, e.agent, rid)
                self._forget(rk, batch)
                batch.deletes.add(rk)
            return
        er = Erasure.of(e)
        self._erase(er, batch)
        if er.everywhere:
            self.erased_everywhere.append(er)
            self.awaiting += [peer.purge(er) for peer in self.peers]

    def _forget(self, rk: RecordKey, batch: _Batch) -> None:
        """Neither write nor wait for record `rk` any more."""
        batch.upserts.pop(rk, None)
        if rk in self.parked_at:
            stale = self._drop_parked(rk)
            if stale is not None:
                batch.done.append(stale[1])

    def _erase(self, er: Erasure, batch: _Batch) -> None:
        """The batch's points and the parked records of an erased subject go; the index's go
        when the batch is written, before its upserts (which came after the erasure)."""
        doomed = [rk for rk, (r, _) in batch.upserts.items() if er.covers_record(r)]
        doomed += [rk for rk, (h, _, _) in self.parked_at.items() if er.covers_record(self.parked[h][rk][0])]
        for rk in doomed:
            self._forget(rk, batch)
        batch.purges.append(er)

    def purge(self, er: Erasure) -> asyncio.Future:
        """A peer's erasure of every agent of a tenant: applied with this shard's next write,
        after which it is flushed. Resolves once it is."""
        fut = asyncio.get_running_loop().create_future()
        if self.running:
            self.purges.append((fut, er))
        else:
            self._purge_now([(fut, er)])
        return fut

    def _take_purges(self, batch: _Batch) -> None:
        for fut, er in self.purges:
            self._erase(er, batch)
            batch.purge_futs.append(fut)
        self.purges.clear()

    def _purge_now(self, purges: list[tuple[asyncio.Future, Erasure]]) -> None:
        """Purges queued for a loop that no longer runs: applied and flushed here."""
        try:
            for _, er in purges:
                self.index.purge(er)
            if purges:
                self.index.flush()
        except Exception:  # a shard closed under it: its generation is retired anyway
            log.exception("qdrant_purge_failed", shard=str(self.index.path))
        for fut, _ in purges:
            if not fut.done():
                fut.set_result(None)

    def _peers_purged(self) -> bool:
        self.awaiting = [f for f in self.awaiting if not f.done()]
        return not self.awaiting

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

    def _hold_vector(self, h: str, part: str, offset: int) -> None:
        if (prev := self.unused.get(h)) is not None:  # the same vector again: keep the later copy
            self.held_vectors[prev[0]].pop(prev[1], None)
        self.unused[h] = (part, offset)
        self.held_vectors.setdefault(part, OrderedDict())[offset] = None

    def _release_vectors(self) -> None:
        """Every event written so far has been read: no record needs a held vector."""
        if self.unused:
            self.unused.clear()
            self.held_vectors.clear()

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

    # ------------------------------------------------------------------ healing

    def heal(self, upserts: list[tuple[LeanRecord, Any]], deletes: list[tuple[RecordKey, int]],
             shadowed: set[RecordKey] | frozenset[RecordKey] = frozenset()) -> asyncio.Future:
        """Queue points a reconciler found missing (record, vector) or stale (key, version
        of the record view that is not indexable). The loop applies them in order with its
        own writes, skipping any record it has since seen a newer version of; resolves with
        (points upserted, points deleted) once written."""
        fut = asyncio.get_running_loop().create_future()
        self.heals.append((fut, upserts, deletes, set(shadowed)))
        return fut

    def _take_heals(self, batch: _Batch) -> None:
        for fut, upserts, deletes, shadowed in self.heals:
            added = removed = 0
            for r, vec in upserts:
                rk = (sys.intern(r.tenant), sys.intern(r.agent), r.id)
                if self.versions.get(rk, 0) > r.version:
                    continue
                if rk in self.parked_at:
                    h = self.parked_at[rk][0]
                    if self.parked[h][rk][0].version > r.version:
                        continue
                    # Parked, as just read: `_drop_parked` returns it.
                    batch.done.append(cast("tuple[LeanRecord, LeanEvent]", self._drop_parked(rk))[1])
                self.versions[rk] = r.version
                batch.deletes.discard(rk)
                batch.upserts[rk] = (r, vec)
                if rk in shadowed:
                    batch.shadows.append(rk)
                added += 1
            for rk, version in deletes:
                if self.versions.get(rk, 0) > version or rk in self.parked_at or rk in batch.upserts:
                    continue
                batch.deletes.add(rk)
                removed += 1
            batch.heals.append((fut, (added, removed)))
        self.heals.clear()

    def cached_vector(self, h: str) -> array.array | None:
        return self._vector(h, final=True)

    def parked_version(self, rk: RecordKey) -> int | None:
        at = self.parked_at.get(rk)
        return None if at is None else self.parked[at[0]][rk][0].version

    def _vector(self, h: str, final: bool = False) -> array.array | None:
        """The vector of content hash `h`, decoded (and opened) on first use; None if absent,
        bad or sealed under a destroyed key. Raises `KeyMissing` unless `final`."""
        held = self.vectors.get(h)
        if not isinstance(held, bytes):
            return held
        try:
            msg = decode_lean_vector(held)
            if (msg.model, msg.content_hash) != (self.model_id, h):
                raise ContractError("content_hash", f"the message key names {self.model_id}/{h}, the value "
                                    f"{msg.model}/{msg.content_hash}")
            vec = msg.floats()
        except ContractError as err:
            # Records wait for a good vector; the embedding worker owns its DLQ.
            log.warning("projection_skipped_vector", content_hash=h, error=str(err))
            del self.vectors[h]
            return None
        except (KeyMissing, KeyDestroyed) as err:
            if isinstance(err, KeyMissing) and not final:
                raise
            self.unreadable += 1
            del self.vectors[h]
            return None
        self.vectors[h] = vec
        return vec

    def _unpark(self, event: LeanEvent) -> None:
        key = command_key(event.tenant, event.agent, event.command_id)
        self.parked_commands[key] -= 1
        if self.parked_commands[key] <= 0:
            del self.parked_commands[key]

    def _write(self, batch: _Batch) -> None:
        for er in batch.purges:
            self.index.purge(er)
        # The index reads only fields a LeanRecord shares with a MemoryRecord, and any float sequence.
        self.index.upsert(cast(Any, list(batch.upserts.values())))
        self.index.delete(list(batch.deletes))
        for tenant, agent, rid in batch.shadows:
            try:
                self.index.set_shadowed(tenant, agent, rid, True)
            except Exception:  # the live record is not a point (not ACTIVE): nothing to hide
                log.debug("shadow_target_missing", record_id=rid)
        if batch.purge_futs:
            self.index.flush()  # the peer that asked saves no checkpoint past its erasure before this

    def checkpoint(self) -> dict[str, Any]:
        """What a restart may resume from, for what has been written (call it with no batch
        in flight): each position held back to the first parked event or held vector."""
        return safe_checkpoint(self.ckpt, self.held_events, self.held_vectors, self.redo)

    def _save_checkpoint(self, ckpt: dict[str, Any]) -> None:
        self.index.flush()
        write_checkpoint(self.ckpt_path, ckpt)

    # ------------------------------------------------------------------ the loop

    async def run(
        self,
        until_caught_up: bool = False,
        progress: Callable[[int, int], None] | None = None,
        stop: dict[int, int] | None = None,
    ) -> None:
        """Follow the topics. A rebuild passes `until_caught_up` and reads all vectors first;
        a replay also passes `stop`, the event offset to end before, per partition."""
        s = self.settings
        etps = [TopicPartition(s.topic(EVENTS.name), p) for p in self.partitions]
        vtps = [TopicPartition(s.topic(VECTORS.name), p) for p in vector_partitions(self.partitions)]
        # Serving, the ledger's answers to retried commands too: from where they end now (an
        # answer before this process started has no one waiting here).
        rtps = [] if until_caught_up else [TopicPartition(s.topic(REPLIES.name), p) for p in self.partitions]
        c = TopicReader(s, max_poll_records=2000)
        self.running = True
        try:
            async with c:
                if until_caught_up or not self.ckpt:
                    # From the start of the log, vectors and events arrive in any order: read
                    # the vectors first and keep them all, so no record waits on a vector that
                    # already went by. Afterwards vectors trail their events and a cache will do.
                    self._bound, self.vector_cache = self.vector_cache, None
                    await self._follow(c, vtps, until_caught_up=True, progress=None)
                if rtps:
                    ends = await c.ends(rtps)
                    self.ckpt.update({tp_key(tp): end for tp, end in ends.items() if tp_key(tp) not in self.ckpt})
                await self._follow(c, etps + vtps + rtps, until_caught_up, progress, events=etps, stop=stop)
        finally:
            self.running = False
            purges, self.purges = self.purges, []
            self._purge_now(purges)

    async def _follow(self, c: TopicReader, tps, until_caught_up, progress, events=None, stop=None) -> None:
        s = self.settings
        vectors_topic, replies_topic = s.topic(VECTORS.name), s.topic(REPLIES.name)
        await c.assign(tps, self.ckpt)
        watch = events or tps
        end = await c.ends(watch, {tp: stop[tp.partition] for tp in watch if stop and tp.partition in stop})
        total = sum(end.values())
        vector_tps = [tp for tp in tps if tp.topic == vectors_topic and tp not in watch]
        dirty, last_flush = False, time.monotonic()
        inflight: tuple[asyncio.Task | None, _Batch] | None = None

        async def land() -> None:
            # Writes run in a thread while the next batch is fetched and decoded.
            nonlocal inflight, dirty
            if inflight:
                task, done_batch = inflight
                inflight = None
                if task is not None:
                    await task
                self.ckpt.update(done_batch.positions)
                self.applied += len(done_batch.upserts) + len(done_batch.deletes)
                for e in done_batch.done:
                    self._command_done(e)
                self.applied_to.update(done_batch.read_to)
                self._answer_replies()
                for fut, n in done_batch.heals:
                    if not fut.done():
                        fut.set_result(n)
                for fut in done_batch.purge_futs:
                    if not fut.done():
                        fut.set_result(None)
                dirty = True

        while not self.stopping.is_set():
            batch = _Batch()
            for tp, msgs in (await c.poll(timeout_ms=200, max_records=2000)).items():
                part = tp_key(tp)
                if tp.topic == replies_topic:
                    await self._take_replies(c, tp, msgs)
                    batch.positions[part] = msgs[-1].offset + 1
                    continue
                is_vector = tp.topic == vectors_topic
                for m in msgs:
                    try:
                        self._take(m, is_vector, batch, part)
                    except ContractError as err:
                        # The workers that write these topics own their DLQs; a reader only skips.
                        log.warning("projection_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                    except KeyMissing:
                        # A key published after this process last caught up: once more, after.
                        if self.keys is not None:
                            await self.keys.catch_up()
                        try:
                            self._take(m, is_vector, batch, part, final=True)
                        except ContractError as err:
                            log.warning("projection_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                    batch.positions[part] = m.offset + 1
                batch.seen += len(msgs)
            if self.heals:
                self._take_heals(batch)
            if self.purges:
                self._take_purges(batch)
            if batch.event_positions:
                assert self.also is not None  # positions are kept only for `also`
                await self.also(batch.events, batch.event_positions)
            settle_heap()
            await land()
            if batch.seen or batch.heals or batch.purges:
                if self.serving and batch.writes() > INLINE_WRITES:
                    inflight = (asyncio.create_task(asyncio.to_thread(self._write, batch)), batch)
                else:
                    self._write(batch)
                    inflight = (None, batch)
            if events and self.vector_cache is not None:
                await self._pace_vectors(c, vector_tps, events)
            pos = await c.positions(watch)
            if events:
                read_to = {tp_key(tp): at for tp, at in pos.items()}
                if inflight is None:  # nothing read this time waits to be written
                    self.applied_to.update(read_to)
                    self._answer_replies()
                else:
                    inflight[1].read_to = read_to
            done = reached(pos, end)
            if done or not batch.seen:
                await land()
            # Flushing is what makes a checkpoint safe, and it is costly (docs/decisions/0004-qdrant-edge-embedded-index.md):
            # every few seconds when live, rarely while catching up. A crash
            # replays what came after the last flush; searches never wait for one.
            # A live projection is caught up after nearly every batch, so reaching the end
            # flushes only on the way to being caught up (or at the end of a replay).
            live = self.caught_up.is_set()
            every = LIVE_FLUSH_S if live else 30.0
            # The vectors-first pass saves none: it holds every vector it read.
            due = (done and (until_caught_up or not live)) or time.monotonic() - last_flush > every or (
                self.faults.armed(INDEX_CHECKPOINT_WITH_PARKED) and self.parked_count() > 0)  # a crash test's point
            if dirty and events and due and self._peers_purged():
                await land()
                await asyncio.to_thread(self._save_checkpoint, self.checkpoint())
                if self.parked_count():
                    self.faults.reached(INDEX_CHECKPOINT_WITH_PARKED)
                dirty, last_flush = False, time.monotonic()
            if progress:
                progress(read_so_far(pos, end), total)
            if done:
                # Caught up once every record read is in, or waits for a vector not yet written.
                if not self.caught_up.is_set() and events and (
                    until_caught_up or not self.parked_count() or await c.read_to_end(vector_tps)
                ):
                    self._bound_cache()
                    self.caught_up.set()
                    log.info("qdrant_projection_caught_up", points=self.index.count(), parked=self.parked_count())
                if until_caught_up:
                    break
        await land()

    def _take(self, m: Any, is_vector: bool, batch: _Batch, part: str, final: bool = False) -> None:
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

    async def _pace_vectors(self, c: TopicReader, vector_tps: list, event_tps: list) -> None:
        """Join in bounded memory: a vector read before its event is kept until the event
        comes; when too many wait, vectors pause until the events catch up. Events never
        pause, so this cannot deadlock."""
        behind = [tp for tp in event_tps if (c.last_stable_offset(tp) or 0) > await c.position(tp)]
        if not behind:
            self._release_vectors()  # every written event has been read: these are plain cache entries
        assert self.vector_cache is not None  # the caller paces only with a bounded cache
        if behind and len(self.unused) >= self.vector_cache:
            c.pause(*vector_tps)
        else:
            c.resume(*vector_tps)
        self._trim_cache()

    def _trim_cache(self) -> None:
        assert self.vector_cache is not None  # both callers have a bounded cache
        excess = len(self.vectors) - len(self.unused) - self.vector_cache
        if excess <= 0:
            return
        for h in [h for h in self.vectors if h not in self.unused][:excess]:
            del self.vectors[h]

    def _bound_cache(self) -> None:
        if self.vector_cache is None and self._bound is not None:
            self.vector_cache = self._bound
            self._release_vectors()
            self._trim_cache()

    def parked_count(self) -> int:
        return sum(len(b) for b in self.parked.values())

    def searchable_to(self, tenant: str, agent: str, partition: int) -> int:
        """The event offset of `partition` before which every event of the agent is searchable
        here: read and written to the index, none still parked (a serve replica's read fence)."""
        part = tp_key(TopicPartition(self.settings.topic(EVENTS.name), partition))
        held = [off for (t, a, _), (_, p, off) in self.parked_at.items() if t == tenant and a == agent and p == part]
        return min([self.ckpt.get(part, 0), *held])

    def status(self) -> dict[str, Any]:
        return {
            "points": self.index.count(),
            "parked": self.parked_count(),
            "caught_up": self.caught_up.is_set(),
            "applied": self.applied,
            "unreadable": self.unreadable,
        }


class _Batch:
    def __init__(self) -> None:
        self.upserts: dict[RecordKey, tuple[LeanRecord, array.array]] = {}
        self.deletes: set[RecordKey] = set()
        self.shadows: list[RecordKey] = []
        self.done: list[LeanEvent] = []
        self.heals: list[tuple[asyncio.Future, tuple[int, int]]] = []
        self.purges: list[Erasure] = []  # applied before the upserts
        self.purge_futs: list[asyncio.Future] = []  # peers' purges: resolved once flushed
        self.positions: dict[str, int] = {}
        self.read_to: dict[str, int] = {}  # events' positions after this batch, commit markers and all
        self.events: list[LeanEvent] = []  # for `also`
        self.event_positions: list[tuple[str, int]] = []
        self.seen = 0

    def writes(self) -> int:
        return len(self.upserts) + len(self.deletes) + len(self.shadows) + len(self.purges)


def load_checkpoint(path: Path) -> tuple[dict[str, int], dict[str, tuple[int, set[int]]]]:
    """(positions, redo): see `safe_checkpoint`."""
    saved: dict[str, Any] = read_checkpoint(path)
    parked, read = saved.pop(PARKED, {}), saved.pop(READ, {})
    return saved, {part: (end, set(parked.get(part, ()))) for part, end in read.items()}


def safe_checkpoint(
    read: dict[str, int],
    held_events: dict[str, OrderedDict[int, None]],
    held_vectors: dict[str, OrderedDict[int, None]],
    redo: dict[str, tuple[int, set[int]]],
) -> dict[str, Any]:
    """Positions to resume from, given those read (`read`) and the offsets still needed.

    A vector partition resumes at its first held vector. An event partition resumes at
    its first parked event, and the checkpoint lists the parked offsets (`_parked`) and
    where reading had got to (`_read`): events between them were applied and are skipped.
    A range still being redone after a restart carries over what it has not reached."""
    out: dict[str, Any] = dict(read)
    for part, offsets in held_vectors.items():
        if offsets:
            out[part] = min(out.get(part, 0), next(iter(offsets)))
    parked: dict[str, list[int]] = {}
    ends: dict[str, int] = {}
    for part in held_events.keys() | redo.keys():
        pos = read.get(part, 0)
        waiting = list(held_events.get(part, ()))
        end = pos
        if part in redo:
            end = max(pos, redo[part][0])
            waiting += sorted(o for o in redo[part][1] if o >= pos)
        if waiting:
            out[part] = waiting[0]
            parked[part], ends[part] = waiting, end
        else:
            out[part] = end
    if parked:
        out[PARKED], out[READ] = parked, ends
    return out
