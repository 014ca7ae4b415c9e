"""Heals in the Qdrant projection: points a reconciler (`workers.followers.reconciler`) found
missing or stale, applied by the projection's loop in order with its own writes, so a heal
never undoes a newer version the loop has read since."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

from events.lean import LeanEvent, LeanRecord
from projections.qdrant.index import RecordKey
from workers.followers.qdrant_batch import Batch
from workers.followers.qdrant_join import Join

Heal = tuple[asyncio.Future, list[tuple[LeanRecord, Any]], list[tuple[RecordKey, int]], set[RecordKey]]


class Heals(Join):
    """The heals part of `QdrantProjection`, which sets this state up."""

    heals: list[Heal]  # queued for the loop's next write

    def heal(self, upserts: list[tuple[LeanRecord, Any]], deletes: list[tuple[RecordKey, int]],
             shadowed: set[RecordKey] | frozenset[RecordKey] = frozenset()) -> asyncio.Future:
        """Queue points a reconciler found missing (record, vector) or stale (key, version
        of the record view that is not indexable). The loop applies them in order with its
        own writes, skipping any record it has since seen a newer version of; resolves with
        (points upserted, points deleted) once written."""
        fut = asyncio.get_running_loop().create_future()
        self.heals.append((fut, upserts, deletes, set(shadowed)))
        return fut

    def _take_heals(self, batch: Batch) -> None:
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
