"""The memory shards this API process serves, and their swap to a rebuilt generation.

The serving process also runs the Qdrant projection for its shard, because an Edge shard
belongs to one process. With a Qdrant server the same holds: the projection's read-your-writes
waits are answered in this process, and the generation to serve is the one the collection
aliases name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import structlog

from events.codec import Codec
from projections.qdrant.generations import IndexGenerations
from services.http.following import report_end
from settings import Settings
from workers.followers.memory_shards import MemoryShards
from workers.runtime.tracing import NO_TRACING, Tracing

if TYPE_CHECKING:
    from projections.embedders.port import Embedder
    from projections.redis.connection import Connect
    from workers.runtime.data_keys import KeyTopic

log = structlog.get_logger()


class ShardOwner:
    """Owns the memory shards of the current generation and their projection task.

    `memlane rebuild` fills the next generation beside this one and moves the pointer;
    the owner then opens the new shards, lets their projections catch up, and swaps.
    """

    def __init__(self, settings: Settings, generations: IndexGenerations, redis: Connect, codec: Codec,
                 embedder: Embedder | None = None, keys: KeyTopic | None = None,
                 tracing: Tracing = NO_TRACING) -> None:
        self.settings = settings
        self.tracing = tracing
        self.generations = generations
        self.codec = codec
        self.redis = redis
        self.generation = 0
        self.memory: MemoryShards | None = None
        self.task: asyncio.Task | None = None
        self.on_swap: Callable[[ShardOwner], None] | None = None
        self.embedder = embedder  # the process's, for the points the shards' reconciler heals
        self.keys = keys  # the process's data keys, for what the shards open (None: encryption off)
        self._retiring: set[asyncio.Task] = set()

    async def open(self, generation: int) -> None:
        memory = MemoryShards(self.settings, self.generations, generation, self.redis, self.embedder, self.keys,
                              codec=self.codec, tracing=self.tracing)
        task = asyncio.create_task(memory.run(), name=f"qdrant-projection-g{generation}")
        task.add_done_callback(report_end)
        old = (self.memory, self.task)
        if old[0] is not None:
            await memory.caught_up()
        self.memory, self.task, self.generation = memory, task, generation
        if self.on_swap:
            self.on_swap(self)
        if old[0] is not None:
            log.info("qdrant_generation_switched", generation=generation)
            # Retired in the background: a slow teardown must never hold up the watcher, or a
            # generation rebuilt meanwhile would never be opened.
            # The old shards and their task were set together, so neither is None here.
            retiring = asyncio.create_task(self._retire(*cast("tuple[MemoryShards, asyncio.Task]", old)),
                                           name=f"qdrant-retire-g{old[0].generation}")
            self._retiring.add(retiring)
            retiring.add_done_callback(self._retiring.discard)

    async def _retire(self, memory: MemoryShards, task: asyncio.Task) -> None:
        # Callers that registered on the old shards before the swap hear from them.
        await memory.drained(timeout=10)
        await self._stop(memory, task)

    async def watch_generation(self) -> None:
        while True:
            await asyncio.sleep(1)
            try:
                # With a Qdrant server this asks it which generation the aliases name.
                gen = await asyncio.to_thread(self.generations.current)
            except Exception as e:  # a server restarting: serve what is open, ask again
                log.warning("qdrant_generation_unknown", error=f"{type(e).__name__}: {e}")
                continue
            if gen != self.generation:
                await self.open(gen)

    @staticmethod
    async def _stop(memory: MemoryShards, task: asyncio.Task) -> None:
        memory.stop()
        # `asyncio.wait`, not `wait_for`: on timeout it does not wait for the cancelled task
        # to finish, which a projection blocked in a client's shutdown might never do.
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            log.warning("qdrant_projection_stop_slow", generation=memory.generation)
            task.cancel()
        memory.close()

    async def close(self) -> None:
        if self.memory is not None:
            assert self.task is not None  # set together with the shards
            await self._stop(self.memory, self.task)
