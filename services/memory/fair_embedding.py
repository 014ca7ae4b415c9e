"""Query embedding shared fairly between tenants: a search's or a batch's texts wait in their
tenant's queue, in chunks, and `slots` workers take the next chunk from each tenant in turn (a
tenant with nothing waiting goes first), a tenant holding at most half the slots. A tenant
sending 100-item batches of long queries then leaves another tenant's one-line search a free
slot, instead of its whole backlog to wait behind; past `queued` texts waiting, its next
request is refused with 429 and how long to wait (docs/features/fairness.md)."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from events.errors import ErrorCode
from projections.embedders.port import Embedder
from services.errors import ApiError
from workers.runtime.metrics import EMBED_QUEUED

# A chunk holds texts until this many characters (or CHUNK_TEXTS texts): a few short queries
# share one embedder call, a long one goes alone.
CHUNK_CHARS = 2_000
CHUNK_TEXTS = 8


@dataclass
class _Job:
    tenant: str
    texts: list[str]
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def chunks(texts: Sequence[str], chars: int = CHUNK_CHARS, most: int = CHUNK_TEXTS) -> list[list[str]]:
    out: list[list[str]] = []
    size = 0
    for t in texts:
        if not out or size + len(t) > chars or len(out[-1]) >= most:
            out.append([])
            size = 0
        out[-1].append(t)
        size += len(t)
    return out


class FairEmbedding:
    def __init__(self, embedder: Embedder, slots: int = 2, queued: int = 256) -> None:
        self.embedder, self.slots, self.queued = embedder, slots, queued
        # One tenant holds at most half the slots: another tenant's query finds one free.
        self.per_tenant = max(1, slots // 2)
        self.waiting: OrderedDict[str, deque[_Job]] = OrderedDict()  # tenant -> its chunks, in turn order
        self.texts: dict[str, int] = {}  # tenant -> texts queued or being embedded
        self.running: dict[str, int] = {}  # tenant -> its chunks being embedded
        self.per_text_s = 0.02  # moving average, for the Retry-After estimate
        self._wake: asyncio.Event | None = None
        self._workers: list[asyncio.Task] = []

    async def embed(self, tenant: str, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        # Texts embedded moments ago (the next page of a search, a retried call) need no model:
        # answered here, not after a thread's hop, which under load waits on the interpreter lock.
        if (vectors := self.embedder.cached(texts)) is not None:
            return vectors
        held = self.texts.get(tenant, 0)
        if held and held + len(texts) > self.queued:
            wait = max(1, math.ceil(held * self.per_text_s / self.slots))
            raise ApiError(ErrorCode.RATE_LIMITED, None,
                           f"this tenant already has {held} queries waiting to be embedded (at most {self.queued}); "
                           f"retry after {wait} s", 429, retry_after=wait)
        self._start()
        jobs = [_Job(tenant, c) for c in chunks(texts)]
        self.texts[tenant] = held + len(texts)
        EMBED_QUEUED.inc(len(texts))
        if tenant not in self.waiting:
            # A tenant with nothing waiting goes first: the one just served is a backlog's.
            self.waiting[tenant] = deque()
            self.waiting.move_to_end(tenant, last=False)
        self.waiting[tenant].extend(jobs)
        assert self._wake is not None  # `_start` made it
        self._wake.set()
        try:
            return [v for vecs in await asyncio.gather(*(j.done for j in jobs)) for v in vecs]
        finally:
            EMBED_QUEUED.dec(len(texts))
            left = self.texts.get(tenant, 0) - len(texts)
            if left > 0:
                self.texts[tenant] = left
            else:
                self.texts.pop(tenant, None)

    def _start(self) -> None:
        if self._workers:
            return
        self._wake = asyncio.Event()
        self._workers = [asyncio.create_task(self._work(), name=f"fair-embedding-{i}") for i in range(self.slots)]

    def _next(self) -> _Job | None:
        """The first chunk of the first tenant in turn with a slot to spare; that tenant then
        goes to the back."""
        for tenant in list(self.waiting):
            if self.running.get(tenant, 0) >= self.per_tenant:
                continue
            jobs = self.waiting[tenant]
            while jobs and jobs[0].done.cancelled():
                jobs.popleft()
            if not jobs:
                del self.waiting[tenant]
                continue
            job = jobs.popleft()
            if jobs:
                self.waiting.move_to_end(tenant)
            else:
                del self.waiting[tenant]
            self.running[tenant] = self.running.get(tenant, 0) + 1
            return job
        return None

    async def _work(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            job = self._next()
            if job is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            t0 = loop.time()
            try:
                vecs = await asyncio.to_thread(self.embedder.embed, job.texts)
            except Exception as e:  # the caller's error, not the worker's
                if not job.done.done():
                    job.done.set_exception(e)
                continue
            finally:
                left = self.running[job.tenant] - 1
                if left:
                    self.running[job.tenant] = left
                else:
                    del self.running[job.tenant]
                self._wake.set()  # a slot of that tenant's is free: a worker may take its next chunk
            self.per_text_s = 0.9 * self.per_text_s + 0.1 * (loop.time() - t0) / len(job.texts)
            if not job.done.done():
                job.done.set_result(vecs)

    async def aclose(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
