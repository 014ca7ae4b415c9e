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

This module holds the projection's state and its loop; its parts are beside it: the join
(`qdrant_join`, `qdrant_vectors`), purges (`qdrant_purges`), heals (`qdrant_heals`),
read-your-writes (`qdrant_answers`), the batch it writes (`qdrant_batch`) and the checkpoint
(`qdrant_checkpoint`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import structlog
from aiokafka import TopicPartition

from events.codec import Codec, ContractError
from events.sealing import KeyMissing
from events.topics import EVENTS, REPLIES, VECTORS, vector_partitions
from projections.embedders.port import embedder_model_id
from projections.qdrant.index import EdgeIndex, write_checkpoint
from settings import Settings
from workers.followers.qdrant_answers import ReadYourWrites
from workers.followers.qdrant_batch import Batch as _Batch
from workers.followers.qdrant_checkpoint import PARKED as PARKED
from workers.followers.qdrant_checkpoint import READ as READ
from workers.followers.qdrant_checkpoint import load_checkpoint, safe_checkpoint
from workers.followers.qdrant_heals import Heals
from workers.followers.qdrant_join import Also
from workers.followers.qdrant_purges import Purges
from workers.runtime.faults import INDEX_CHECKPOINT_WITH_PARKED, Faults
from workers.runtime.follower_poison import FollowerPoison
from workers.runtime.heap import settle_heap
from workers.runtime.topic_reader import TopicReader, reached, read_so_far, tp_key
from workers.runtime.tracing import NO_TRACING, Tracing

if TYPE_CHECKING:
    from projections.qdrant.client_index import ClientIndex

log = structlog.get_logger()
LIVE_FLUSH_S = 5.0
VECTOR_CACHE = 50_000  # vectors kept as read (about 2.2 KB each) by a serving process
INLINE_WRITES = 32  # points; more go to a worker thread while serving


class QdrantProjection(ReadYourWrites, Heals, Purges):
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
        poison: FollowerPoison | None = None,
        *,
        codec: Codec,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.settings = settings
        self.codec = codec
        # A traced message's span ends once its batch is written: from there it is searchable.
        self.tracing = tracing
        self.faults = Faults(settings.fault_at)
        self.keys = keys
        self.unreadable = 0
        # Purges (`Purges`).
        self.peers = []
        self.purges = []
        self.awaiting = []
        self.erased_everywhere = []
        self.running = False
        self.index = index
        # The event partitions whose records this index holds (a shard's; all by default).
        self.partitions = list(range(EVENTS.partitions)) if partitions is None else partitions
        # Serving searches too: large writes go to a worker thread, so the event loop gets a
        # turn between Edge calls; a rebuild and small writes stay inline (docs/decisions/0004-qdrant-edge-embedded-index.md).
        self.serving = serving
        # A message that breaks the contract is parked while serving; a rebuild, which reads
        # the log again, only skips what was parked live.
        self.poison = poison or FollowerPoison(settings, "memory-index", codec)
        self._own_poison = poison is None  # else the shards' owner closes it
        # Another view folded from the same pass over the events, each batch with its
        # checkpoint positions: a rebuild's shard process also fills its agents' Redis
        # records, so each event is read and decoded once.
        self.also = also
        # The join (`Join`, `VectorCache`).
        self.model_id = model_id or embedder_model_id(settings)
        self.vector_cache = vector_cache
        self._bound = vector_cache
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        # Positions read and written to the index (the saved checkpoint may be behind them);
        # `redo`: partition -> (read position, offsets to apply again) after a restart.
        self.ckpt, self.redo = load_checkpoint(self.ckpt_path)
        # Events before these are in the index without this process having read them.
        self.started = {k: max(v, self.redo[k][0] if k in self.redo else 0) for k, v in self.ckpt.items()}
        self.vectors = OrderedDict()
        self.parked = {}
        self.parked_at = {}
        self.parked_commands = Counter()
        self.unused = {}
        self.held_events = {}
        self.held_vectors = {}
        self.versions = {}
        self.heals = []  # `Heals`
        # Read-your-writes (`ReadYourWrites`).
        self._answering = set()
        self.waiters = {}
        self.done_commands = OrderedDict()
        self.replies = []
        self.replying = set()
        self.applied_to = {}
        self.applied = 0
        self.stopping = asyncio.Event()
        self.caught_up = asyncio.Event()

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
            if self._own_poison:
                await self.poison.aclose()

    async def _follow(self, c: TopicReader, tps: list[TopicPartition], until_caught_up: bool,
                      progress: Callable[[int, int], None] | None, events: list[TopicPartition] | None = None,
                      stop: dict[int, int] | None = None) -> None:
        """Reads `tps` from the checkpoint and writes what they say, batch after batch, until
        stopped or (`until_caught_up`) at the end of `events` (of `tps` without them)."""
        await c.assign(tps, self.ckpt)
        watch = events or tps
        end = await c.ends(watch, {tp: stop[tp.partition] for tp in watch if stop and tp.partition in stop})
        vectors_topic = self.settings.topic(VECTORS.name)
        vector_tps = [tp for tp in tps if tp.topic == vectors_topic and tp not in watch]
        f = _Pass(c, end, sum(end.values()), vector_tps, events, until_caught_up)
        while not self.stopping.is_set():
            batch = await self._read(c)
            if self.heals:
                self._take_heals(batch)
            if self.purges:
                self._take_purges(batch)
            if batch.event_positions:
                assert self.also is not None  # positions are kept only for `also`
                await self.also(batch.events, batch.event_positions)
            settle_heap()
            await self._land(f)
            self._start_write(f, batch)
            if events and self.vector_cache is not None:
                await self._pace_vectors(c, vector_tps, events)
            pos = await c.positions(watch)
            if events:
                self._read_to(f, {tp_key(tp): at for tp, at in pos.items()})
            done = reached(pos, end)
            if done or not batch.seen:
                await self._land(f)
            await self._save_if_due(f, done)
            if progress:
                progress(read_so_far(pos, end), f.total)
            if done:
                await self._check_caught_up(f)
                if until_caught_up:
                    break
        await self._land(f)

    async def _read(self, c: TopicReader) -> _Batch:
        """One poll, folded into a batch to write."""
        vectors_topic, replies_topic = self.settings.topic(VECTORS.name), self.settings.topic(REPLIES.name)
        batch = _Batch()
        for tp, msgs in (await c.poll(timeout_ms=200, max_records=2000)).items():
            part = tp_key(tp)
            if tp.topic == replies_topic:
                await self._take_replies(c, tp, msgs)
                batch.positions[part] = msgs[-1].offset + 1
                continue
            is_vector = tp.topic == vectors_topic
            for m in msgs:
                await self._take_or_skip(m, is_vector, batch, part, tp.topic)
                batch.positions[part] = m.offset + 1
            batch.seen += len(msgs)
        return batch

    async def _take_or_skip(self, m: Any, is_vector: bool, batch: _Batch, part: str, topic: str) -> None:
        """`_take` of a message, parked (`_poison`) if it breaks the contract."""
        if self.poison.for_another(m):
            return
        if self.tracing.enabled:
            batch.spans.append(self.tracing.begun(f"memory-index {VECTORS.name if is_vector else EVENTS.name}",
                                                  m.headers, **{"messaging.destination.name": topic,
                                                                "messaging.kafka.offset": m.offset}))
        try:
            self._take(m, is_vector, batch, part)
        except ContractError as err:
            await self._poison(m, is_vector, topic, str(err))
        except KeyMissing:
            # A key published after this process last caught up: once more, after.
            if self.keys is not None:
                await self.keys.catch_up()
            try:
                self._take(m, is_vector, batch, part, final=True)
            except ContractError as err:
                await self._poison(m, is_vector, topic, str(err))

    async def _poison(self, m: Any, is_vector: bool, topic: str, error: str) -> None:
        if self.serving:
            await self.poison.park(VECTORS.name if is_vector else EVENTS.name, m, error)
        else:
            log.warning("projection_skipped_message", topic=topic, offset=m.offset, error=error)

    def _start_write(self, f: _Pass, batch: _Batch) -> None:
        """Writes a batch with anything in it; a large one, while serving, in a thread while the
        next batch is fetched and decoded. It is in flight until it lands."""
        if batch.seen or batch.heals or batch.purges:
            if self.serving and batch.writes() > INLINE_WRITES:
                f.inflight = (asyncio.create_task(asyncio.to_thread(self._write, batch)), batch)
            else:
                self._write(batch)
                f.inflight = (None, batch)

    async def _land(self, f: _Pass) -> None:
        """Once the batch in flight is written: its positions are read, its commands and heals
        answered, and a checkpoint may be saved."""
        if f.inflight:
            task, batch = f.inflight
            f.inflight = None
            if task is not None:
                await task
            self.ckpt.update(batch.positions)
            self.applied += len(batch.upserts) + len(batch.deletes)
            for e in batch.done:
                self._command_done(e)
            self.applied_to.update(batch.read_to)
            self._answer_replies()
            for fut, n in batch.heals:
                if not fut.done():
                    fut.set_result(n)
            for fut in batch.purge_futs:
                if not fut.done():
                    fut.set_result(None)
            for span in batch.spans:
                span.end()
            f.dirty = True

    def _read_to(self, f: _Pass, read_to: dict[str, int]) -> None:
        """The events' positions after a poll: applied once the batch read in it lands."""
        if f.inflight is None:  # nothing read this time waits to be written
            self.applied_to.update(read_to)
            self._answer_replies()
        else:
            f.inflight[1].read_to = read_to

    async def _save_if_due(self, f: _Pass, done: bool) -> None:
        # Flushing is what makes a checkpoint safe, and it is costly (docs/decisions/0004-qdrant-edge-embedded-index.md):
        # every few seconds when live, rarely while catching up. A crash
        # replays what came after the last flush; searches never wait for one.
        # A live projection is caught up after nearly every batch, so reaching the end
        # flushes only on the way to being caught up (or at the end of a replay).
        live = self.caught_up.is_set()
        every = LIVE_FLUSH_S if live else 30.0
        due = (done and (f.until_caught_up or not live)) or time.monotonic() - f.last_flush > every or (
            self.faults.armed(INDEX_CHECKPOINT_WITH_PARKED) and self.parked_count() > 0)  # a crash test's point
        # The vectors-first pass (no `events`) saves none: it holds every vector it read.
        if f.dirty and f.events and due and self._peers_purged():
            await self._land(f)
            await asyncio.to_thread(self._save_checkpoint, self.checkpoint())
            if self.parked_count():
                self.faults.reached(INDEX_CHECKPOINT_WITH_PARKED)
            f.dirty, f.last_flush = False, time.monotonic()

    async def _check_caught_up(self, f: _Pass) -> None:
        """At the end: caught up once every record read is in, or waits for a vector not yet written."""
        if not self.caught_up.is_set() and f.events and (
            f.until_caught_up or not self.parked_count() or await f.c.read_to_end(f.vector_tps)
        ):
            self._bound_cache()
            self.caught_up.set()
            log.info("qdrant_projection_caught_up", points=self.index.count(), parked=self.parked_count())

    # ------------------------------------------------------------------ reads

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


@dataclass
class _Pass:
    """One `_follow`: where it reads to, and what it has written and not yet checkpointed."""

    c: TopicReader
    end: dict[TopicPartition, int]  # where the pass ends, for the partitions it watches
    total: int
    vector_tps: list[TopicPartition]  # vectors read beside the events, paced by them
    events: list[TopicPartition] | None  # None: the vectors-first pass
    until_caught_up: bool
    dirty: bool = False  # batches landed since the last checkpoint
    last_flush: float = field(default_factory=time.monotonic)
    # The batch being written (a task when in a thread) and not landed yet.
    inflight: tuple[asyncio.Task | None, _Batch] | None = None
