"""Purges in the Qdrant projection: `RecordsPurged` removes records, `SubjectErased` a
subject's points.

An erasure that reaches every agent of a tenant (a member on all of them, or the tenant) is
carried by one shard's partitions, which purges its peers too (the other shards of its
process) and saves no checkpoint past it until they have flushed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from events.lean import LeanEvent
from projections.qdrant.index import EdgeIndex, RecordKey
from projections.records import Erasure
from workers.followers.qdrant_batch import Batch
from workers.followers.qdrant_join import Join

if TYPE_CHECKING:
    from projections.qdrant.client_index import ClientIndex

log = structlog.get_logger()
PURGES = ("SubjectErased", "RecordsPurged")


class Purges(Join):
    """The purges part of `QdrantProjection`, which sets this state up."""

    index: EdgeIndex | ClientIndex
    # The other shards of this process: an erasure of every agent of a tenant reaches them.
    peers: list[Purges]
    purges: list[tuple[asyncio.Future, Erasure]]  # queued by a peer
    awaiting: list[asyncio.Future]  # peers' purges a saved checkpoint waits for
    erased_everywhere: list[Erasure]  # seen here: a replay applies them to every shard
    running: bool  # the loop runs: a peer's purge is queued for it, else applied at once

    def _on_event(self, e: LeanEvent, batch: Batch, part: str, offset: int, final: bool = False) -> None:
        if e.type in PURGES:
            self._on_purge(e, batch)
            batch.done.append(e)
            return
        super()._on_event(e, batch, part, offset, final)

    def _on_purge(self, e: LeanEvent, batch: Batch) -> None:
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

    def _forget(self, rk: RecordKey, batch: Batch) -> None:
        """Neither write nor wait for record `rk` any more."""
        batch.upserts.pop(rk, None)
        if rk in self.parked_at:
            stale = self._drop_parked(rk)
            if stale is not None:
                batch.done.append(stale[1])

    def _erase(self, er: Erasure, batch: Batch) -> None:
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

    def _take_purges(self, batch: Batch) -> None:
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
