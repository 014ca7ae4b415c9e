"""The memory index as it stood at a past point: an Edge shard of the records live then, built
from the point's fold (`past_memory`), for `as_of` searches and recalls.

It is built the way the projection builds the live index (the same points, payloads and BM25
terms), so a search ranks the same way. A record's text never changes in place, so its vector
does not either: vectors come from the live index, and those of records no longer live there are
embedded again by the process's embedder (the same model). Each point builds a shard of its own
under the data directory; the last few are kept (cost: docs/features/time-travel.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from events.record import MemoryRecord
from projections.qdrant.index import EdgeIndex, indexable
from workers.followers.past_memory import Past
from workers.runtime.processes import running

Embed = Callable[[list[str]], Awaitable[list[list[float]]]]
KEPT = 2
BATCH = 1000


class PastIndexes:
    """The shards of one process, under `<parent>/<pid>`: those of a process no longer running
    are removed when another starts."""

    def __init__(self, parent: Path, keep: int = KEPT) -> None:
        for old in parent.glob("*"):
            if old.name.isdigit() and not running(int(old.name)):
                shutil.rmtree(old, ignore_errors=True)
        self.root = parent / str(os.getpid())
        shutil.rmtree(self.root, ignore_errors=True)
        self.keep = keep
        self.built: OrderedDict[tuple[str, str, int, int], EdgeIndex] = OrderedDict()
        # Left out of `built` but maybe still searched by a request begun before: closed at the next eviction.
        self.retired: list[EdgeIndex] = []
        self._lock = asyncio.Lock()

    async def index(self, past: Past, live: Any, embed: Embed) -> EdgeIndex:
        """The index of `past`'s agent at its point. `live`: the live index (`vectors`), or None."""
        async with self._lock:
            if (built := self.built.get(past.key)) is not None:
                self.built.move_to_end(past.key)
                return built
            tenant, agent = past.key[:2]
            records = [r for r in past.fold.records_of(tenant, agent) if indexable(r)]
            ids = [r.id for r in records]
            vectors = await asyncio.to_thread(live.vectors, tenant, agent, ids) if live is not None and ids else {}
            missing = [r for r in records if r.id not in vectors]
            for at in range(0, len(missing), BATCH):
                part = missing[at:at + BATCH]
                vectors.update(zip([r.id for r in part], await embed([r.text for r in part]), strict=True))
            shadowed = await past.fold.shadowed(tenant, agent)
            index = await asyncio.to_thread(self._build, past.key, records, vectors, shadowed)
            self.built[past.key] = index
            while len(self.built) > self.keep:
                for old in self.retired:
                    self._drop(old)
                self.retired = [self.built.popitem(last=False)[1]]
            return index

    def _build(self, key: tuple[str, str, int, int], records: list[MemoryRecord], vectors: dict[str, list[float]],
               shadowed: set[str]) -> EdgeIndex:
        tenant, agent, generation, cut = key
        path = self.root / f"{len(tenant)}-{tenant}-{len(agent)}-{agent}-{generation}-{cut}"
        shutil.rmtree(path, ignore_errors=True)
        dim = len(next(iter(vectors.values()))) if vectors else 384
        index = EdgeIndex(path, dim)
        for at in range(0, len(records), BATCH):
            index.upsert([(r, vectors[r.id]) for r in records[at:at + BATCH]])
        for rid in shadowed & {r.id for r in records}:
            index.set_shadowed(tenant, agent, rid, True)
        return index

    @staticmethod
    def _drop(index: EdgeIndex) -> None:
        index.close()
        shutil.rmtree(index.path, ignore_errors=True)

    def close(self) -> None:
        for index in [*self.built.values(), *self.retired]:
            self._drop(index)
        self.built.clear()
        self.retired = []

