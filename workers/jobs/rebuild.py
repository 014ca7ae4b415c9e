"""Rebuild and replay: fill a new projection generation from the log alone.

A rebuild never calls a model and never embeds: records join the vectors already in
`memlane.vectors`. It reads from offset 0 into a new generation, then switches readers
over once it has caught up with the live generation.

Each process loads the data keys first. What was sealed under a destroyed key (an erased
subject's records, blocks and vectors) is skipped and counted: logged as
`rebuild_skipped_unreadable`, a number and never a text.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import Codec, ContractError
from events.lean import decode_logged
from events.topics import EVENTS
from projections.qdrant import edge_shard
from projections.qdrant.generations import IndexGenerations
from projections.qdrant.index import EdgeIndex
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from settings import Settings
from workers.followers.memory_shards import shard_partitions
from workers.followers.qdrant_projection import QdrantProjection
from workers.jobs.optimize_policy import shard_unindexed, write_left
from workers.runtime.data_keys import open_keys
from workers.runtime.heap import collected_between_batches, settle_heap
from workers.runtime.topic_reader import TopicReader, checkpoint_key, of_topic, tp_key

log = structlog.get_logger()
Progress = Callable[[int, int], None]


@contextlib.asynccontextmanager
async def data_keys(settings: Settings, codec: Codec) -> AsyncIterator[Any]:
    """The data keys as of now (a rebuild reads a log written before it started), loaded into
    `codec`'s keyring; None with encryption off. The keys it makes (an agent's, to seal a block
    in the view) are published before anything sealed under them is written."""
    keys = await open_keys(settings, codec, follow=False)
    try:
        yield keys
    finally:
        if keys is not None:
            await keys.stop()


def report_unreadable(where: str, n: int) -> None:
    if n:
        log.warning("rebuild_skipped_unreadable", target=where, events=n,
                    reason="sealed under destroyed data keys (erased subjects): left out")
    else:
        log.info("rebuild_skipped_unreadable", target=where, events=0)


async def _apply_range(
    settings: Settings,
    store: RedisRecords,
    start: dict[int, int] | None,
    stop: dict[int, int] | None,
    progress: Progress | None,
    fresh: bool = False,
) -> int:
    """Apply events with start <= offset < stop (per partition) to `store`; `fresh`: into
    a generation that nothing else writes (`RedisRecords.fill`)."""
    topic = settings.topic(EVENTS.name)
    applied = 0
    async with TopicReader(settings, max_poll_records=5000) as c:
        tps = [TopicPartition(topic, p) for p in range(EVENTS.partitions)]
        await c.assign(tps, start={p: 0 for p in range(EVENTS.partitions)} | (start or {}))
        # Every partition ends where it ends now, or at `stop` if that is sooner.
        stop_at = await c.ends(tps, {tp: (stop or {}).get(tp.partition, sys.maxsize) for tp in tps})
        first = await c.positions(tps)
        total = sum(max(0, stop_at[tp] - first[tp]) for tp in tps)
        done = 0
        active = [tp for tp in tps if first[tp] < stop_at[tp]]
        while active:
            batches = await c.poll(*active, timeout_ms=500, max_records=5000)
            events, positions = [], []
            for tp, msgs in batches.items():
                part = tp_key(tp)
                for m in msgs:
                    try:
                        if (ev := decode_logged(m.value, m.headers)) is not None:
                            events.append(ev)
                        positions.append((part, m.offset + 1))
                    except ContractError as e:
                        log.warning("rebuild_skipped_message", partition=tp.partition, offset=m.offset, error=str(e))
                done += len(msgs)
            settle_heap()
            if positions:  # a batch of skipped copies still moves the checkpoint on
                await (store.fill if fresh else store.apply)(events, positions)
                applied += len(events)
            active = [tp for tp in active if await c.position(tp) < stop_at[tp]]
            if progress:
                progress(done, total)
    return applied


async def rebuild_redis(
    settings: Settings,
    redis: Connect,
    codec: Codec,
    progress: Progress | None = None,
    switch: bool = True,
    fill: Callable[[int], Awaitable[int]] | None = None,
) -> int:
    """Fill the next Redis generation from offset 0, catch up with the live one, switch.

    `fill(generation)`, when given, does the pass from offset 0 elsewhere (the shard
    processes of `rebuild_all`) and returns the events it applied."""
    async with data_keys(settings, codec) as keys:
        return await _rebuild_redis(settings, redis, progress, switch, fill, keys, codec)


async def _rebuild_redis(settings: Settings, redis: Connect, progress: Progress | None, switch: bool,
                         fill: Callable[[int], Awaitable[int]] | None, keys: Any, codec: Codec) -> int:
    live = RedisRecords(redis(pooled=True), namespace=settings.topic_prefix, codec=codec)
    dropping: asyncio.Future | None = None
    try:
        old = await live.generation()
        gen = max([old, *await live.generations()]) + 1
        # Generations older than the live one are read by no one: drop them while the new
        # one fills. The live one stays, to switch back to.
        stale = [g for g in await live.generations() if g < old] if switch else []
        dropping = asyncio.ensure_future(asyncio.gather(*(live.drop_generation(g) for g in stale)))
        new = RedisRecords(redis(pooled=True), generation=gen, namespace=settings.topic_prefix, keys=keys, codec=codec)
        try:
            if fill is None:
                with collected_between_batches():
                    applied = await _apply_range(settings, new, None, None, progress, fresh=True)
            else:
                applied = await fill(gen)
            # Caught up: reach at least where the live generation's worker has got to.
            live_ckpt = of_topic(await live.checkpoints(old), settings.topic(EVENTS.name))
            while True:
                mine = of_topic(await new.checkpoints(gen), settings.topic(EVENTS.name))
                behind = {p: v for p, v in live_ckpt.items() if mine.get(p, 0) < v}
                if not behind:
                    break
                start = {p: mine.get(p, 0) for p in behind}
                applied += await _apply_range(settings, new, start, behind, None)
            if switch:
                await live.switch_generation(gen)
            await dropping
            log.info("redis_rebuilt", generation=gen, previous=old, events=applied, switched=switch, dropped=stale)
            if fill is None:
                report_unreadable("redis", new.unreadable)
            return gen
        finally:
            await new.aclose()
    finally:
        if dropping and not dropping.done():
            dropping.cancel()
        await live.aclose()


async def replay_redis(
    settings: Settings, redis: Connect, codec: Codec, generation: int, start: dict[int, int] | None, stop: dict[int, int] | None,
    progress: Progress | None = None,
) -> int:
    async with data_keys(settings, codec) as keys:
        store = RedisRecords(redis(pooled=True), generation=generation, namespace=settings.topic_prefix, keys=keys,
                             codec=codec)
        try:
            with collected_between_batches():
                applied = await _apply_range(settings, store, start, stop, progress)
            report_unreadable("redis", store.unreadable)
            return applied
        finally:
            await store.aclose()


async def replay_qdrant(
    settings: Settings, generations: IndexGenerations, codec: Codec, generation: int, start: dict[int, int] | None, stop: dict[int, int] | None,
    progress: Progress | None = None,
) -> int:
    """Fold events into Qdrant generation `generation`, shard after shard, from each
    shard's checkpoint up to `stop`.

    A point keeps no version (each payload key costs every upsert), so a replay only ever
    moves a generation forward: `start` is for a generation that holds no events yet.
    An erasure of every agent of a tenant is in one shard's partitions: once all are
    folded, it is applied to every shard."""
    async with data_keys(settings, codec) as keys:
        return await _replay_qdrant(settings, generations, generation, start, stop, progress, keys, codec)


async def _replay_qdrant(settings: Settings, generations: IndexGenerations, generation: int,
                         start: dict[int, int] | None, stop: dict[int, int] | None, progress: Progress | None,
                         keys: Any, codec: Codec) -> int:
    events_topic = settings.topic(EVENTS.name)
    n = generations.count(generation)
    applied = unreadable = 0
    everywhere = []
    for k in range(n):
        index = generations.open(generation, k)
        try:
            projection = QdrantProjection(settings, index, shard_partitions(k, n), vector_cache=None,
                                          serving=False, keys=keys, codec=codec)
            held = {checkpoint_key(events_topic, p): v for p, v in of_topic(projection.ckpt, events_topic).items()}
            if start and held:
                raise ValueError(
                    f"qdrant generation {generation} already holds events up to its checkpoint; a replay continues "
                    "from there: leave out --from-offset, or replay into a new generation"
                )
            # Vectors from the start of their topic: a record may join a vector written long before.
            projection.ckpt = held | {checkpoint_key(events_topic, p): o for p, o in (start or {}).items()}
            with collected_between_batches():
                await projection.run(until_caught_up=True, progress=_share(progress, k, n), stop=stop)
            applied += projection.applied
            unreadable += projection.unreadable
            everywhere += projection.erased_everywhere
        finally:
            index.close()
    if everywhere and n > 1:
        for k in range(n):
            index = generations.open(generation, k)
            try:
                for er in everywhere:
                    index.purge(er)
            finally:
                index.close()
    report_unreadable("qdrant", unreadable)
    return applied


def _share(progress: Progress | None, k: int, n: int) -> Progress | None:
    """Progress of shard k of n folded one after another, as a share of the whole."""
    if progress is None:
        return None
    return lambda done, total: progress(k * total + done, n * total)


async def _build_shard(
    settings: Settings, redis: Connect, generations: IndexGenerations, codec: Codec, gen: int, k: int, progress: Progress | None, optimize: bool, redis_gen: int | None = None
) -> tuple[int, int, int]:
    """Fold shard k of generation `gen` from offset 0 until caught up, and with `redis_gen`
    the Redis records of the shard's agents into that generation in the same pass.
    Returns (points, events applied to Redis, events and vectors skipped as unreadable).

    `optimize` builds the HNSW index too: slow to build, faster filtered queries (figures:
    docs/decisions/0004-qdrant-edge-embedded-index.md)."""
    async with data_keys(settings, codec) as keys:
        return await _build_shard_with(settings, redis, generations, codec, gen, k, progress, optimize, redis_gen, keys)


async def _build_shard_with(settings: Settings, redis: Connect, generations: IndexGenerations, codec: Codec, gen: int,
                            k: int, progress: Progress | None, optimize: bool, redis_gen: int | None, keys: Any
                            ) -> tuple[int, int, int]:
    n = generations.count(gen)
    index = generations.open(gen, k)
    store = None if redis_gen is None else RedisRecords(
        redis(pooled=True), generation=redis_gen, namespace=settings.topic_prefix, keys=keys, codec=codec)
    applied = 0
    filling: asyncio.Future | None = None

    async def also(events: list, positions: list[tuple[str, int]]) -> None:
        # One batch in flight: Redis writes it while this process folds the next into Edge.
        nonlocal applied, filling
        if filling:
            await filling
        assert store is not None  # the projection is given `also` only with a store
        filling = asyncio.ensure_future(store.fill(events, positions))
        applied += len(events)

    try:
        projection = QdrantProjection(settings, index, shard_partitions(k, n), vector_cache=None,
                                      serving=False, also=also if store else None, keys=keys, codec=codec)
        with collected_between_batches():
            await projection.run(until_caught_up=True, progress=progress)
        if filling:
            await filling
        if parked := projection.parked_count():
            log.warning("records_without_vectors", shard=k, records=parked,
                        hint="their vectors are not on this shard's partitions of memlane.vectors, where the "
                             "embedding worker writes them beside each agent's events; if the log predates that, "
                             "reset the embedding worker's consumer group to the earliest offsets "
                             "(kafka-consumer-groups --reset-offsets --to-earliest), let it catch up, and rebuild")
        if optimize and isinstance(index, EdgeIndex):  # a Qdrant server builds its graphs on its own
            log.info("qdrant_optimizing", shard=k, points=index.count())
            await asyncio.to_thread(index.optimize)
            # What it left unindexed (too small for a graph): the API's optimise policy counts
            # only what comes after (workers.jobs.optimize_policy).
            write_left(index.path, shard_unindexed(index))
        return index.count(), applied, projection.unreadable + (store.unreadable if store else 0)
    finally:
        index.close()
        if filling and not filling.done():
            filling.cancel()
        if store:
            await store.aclose()


def _next_qdrant_generation(generations: IndexGenerations) -> tuple[int, int]:
    """(live generation, an empty next one with the configured shard count)."""
    old = generations.current()
    generations.prepare(old + 1)
    return old, old + 1


def _switch_qdrant(generations: IndexGenerations, old: int, gen: int, points: int, switch: bool) -> None:
    if switch:
        # The CURRENT file, or with a Qdrant server the collection aliases; older generations go.
        generations.switch(old, gen)
    log.info("qdrant_rebuilt", generation=gen, previous=old, points=points, switched=switch)


def _start_method() -> str:
    """"fork" unless this process has used Edge, else "spawn".

    A forked child starts at once, with the modules already imported (spawn imports them
    again: ~0.7 s of CPU per shard). But a child inherits only the forking thread, and
    any lock another thread held at that moment stays held in the child: once Edge's
    native threads run here (it opened a shard), forking is a gamble, so spawn."""
    return "spawn" if edge_shard.opened_in_this_process() else "fork"


_progress_queue: Any = None  # a shard process's line back to the parent (set by `_child_init`)


def _child_init(settings: Settings, queue) -> None:
    global _progress_queue
    import sys

    from settings.logging import configure

    # A forked child inherits the parent's streams, which a progress display may have
    # replaced with proxies that take its lock: log to the real stderr.
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    configure(settings.log_level, service="rebuild.shard")
    _progress_queue = queue


def _build_shard_in_child(settings: Settings, redis: Connect, generations: IndexGenerations,
                          codec_at: Callable[[], Codec], gen: int, k: int, optimize: bool, redis_gen: int | None
                          ) -> tuple[int, int, int]:
    t0, cpu0 = time.perf_counter(), time.process_time()
    points, events, unreadable = asyncio.run(
        _build_shard(settings, redis, generations, codec_at(), gen, k, lambda d, t: _progress_queue.put((k, d, t)), optimize, redis_gen)
    )
    log.info("shard_rebuilt", shard=k, points=points, redis_events=events, unreadable=unreadable,
             wall_s=round(time.perf_counter() - t0, 2), cpu_s=round(time.process_time() - cpu0, 2))
    return points, events, unreadable


async def rebuild_all(
    settings: Settings,
    redis: Connect,
    generations: IndexGenerations,
    codec_at: Callable[[], Codec],
    progress: Callable[[str, int, int], None] | None = None,
    switch: bool = True,
    optimize: bool = False,
    targets: tuple[str, ...] = ("redis", "qdrant"),
) -> dict[str, int]:
    """Rebuild the targets from the log, each memory shard in a process of its own, which
    folds its agents into both projections in one pass: the cores share the work, and
    each event is read and decoded once. `progress(target, done, total)` hears from all.
    `generations` and `codec_at` (which makes a process's codec) are values, pickled into each
    shard's process.
    Returns each target's generation."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import ProcessPoolExecutor

    def report(target: str) -> Progress | None:
        return (lambda done, total: progress(target, done, total)) if progress else None

    if "qdrant" not in targets:
        return {"redis": await rebuild_redis(settings, redis, codec_at(), report("redis"), switch=switch)}
    old, gen = _next_qdrant_generation(generations)
    n = generations.count(gen)
    points = 0

    async def run_shards(redis_gen: int | None) -> int:
        nonlocal points
        method = _start_method()
        ctx = multiprocessing.get_context(method)
        log.info("rebuild_shards_starting", processes=n, start_method=method)
        q = ctx.Queue()
        seen: dict[int, tuple[int, int]] = {}
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(n, mp_context=ctx, initializer=_child_init, initargs=(settings, q)) as pool:
            shards = [loop.run_in_executor(pool, _build_shard_in_child, settings, redis, generations, codec_at, gen,
                                           k, optimize, redis_gen)
                      for k in range(n)]
            pending = set(shards)
            while pending:
                # Wake for a finished shard or, at the latest, to show progress.
                _, pending = await asyncio.wait(pending, timeout=0.25)
                while True:
                    try:
                        k, done, total = q.get_nowait()
                    except queues.Empty:
                        break
                    seen[k] = (done, total)
                    if progress:
                        for target in targets:  # one pass fills both
                            progress(target, sum(d for d, _ in seen.values()), sum(t for _, t in seen.values()))
        # Any: past the check below, each result is a shard's (points, events, unreadable).
        results: list[Any] = await asyncio.gather(*shards, return_exceptions=True)
        if errors := [r for r in results if isinstance(r, BaseException)]:
            raise errors[0]
        points = sum(p for p, _, _ in results)
        report_unreadable(",".join(targets), sum(u for _, _, u in results))
        return sum(e for _, e, _ in results)

    built: dict[str, int] = {}
    if "redis" in targets:
        built["redis"] = await rebuild_redis(settings, redis, codec_at(), switch=switch, fill=run_shards)
    else:
        await run_shards(None)
    _switch_qdrant(generations, old, gen, points, switch)
    built["qdrant"] = gen
    return built
