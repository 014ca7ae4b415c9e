"""The record view's writer: a batch is cut at each purge, each part folded by the live path
(`apply`) or a rebuild's fill (`fill`), then the purge; the checkpoint goes with the last part,
so a crash in between applies it all again, which changes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from events.lean import LeanEvent, as_lean
from events.sealing import kid_of
from projections.redis.record_view_apply import LiveWrites
from projections.redis.record_view_fill import FillMemo, FillWrites
from projections.redis.record_view_fold import FoldView, segments
from projections.redis.record_view_generations import Generations
from projections.redis.record_view_purge import Purger

Positions = list[tuple[str, int]] | None  # `positions[i]`: event i's (topic:partition, next offset)
Segment = Callable[[str, list[LeanEvent], set[str], Positions], Awaitable[None]]


class RecordWriter:
    """Folds batches into the view through the live path or the fill, and applies their purges."""

    def __init__(self, view: FoldView, gens: Generations) -> None:
        self.view = view
        self.gens = gens
        memo = FillMemo()  # shared: a purge forgets what the fill remembers of what it drops
        self.live = LiveWrites(view)
        self.filler = FillWrites(view, memo)
        self.purger = Purger(view, memo)

    async def apply(self, events: list[Any], positions: Positions = None) -> None:
        await self._segmented(events, positions, self.live.segment)

    async def fill(self, events: list[Any], positions: Positions = None) -> None:
        await self._segmented(events, positions, self.filler.segment)

    async def purge(self, ns: str, e: Any) -> None:
        await self.purger.purge(ns, e)

    async def _segmented(self, events: list[Any], positions: Positions, step: Segment) -> None:
        """`step` over the batch up to each purge, then the purge; the checkpoint goes with the last part."""
        ns = await self.gens.register()
        lean = [as_lean(e, self.view.codec) for e in events]
        gone = await self._destroyed_kids(lean)
        for seg, purge in segments(lean):
            await step(ns, seg, gone, None if purge else positions)
            if purge is not None:
                await self.purger.purge(ns, purge)

    async def _destroyed_kids(self, events: list[LeanEvent]) -> set[str]:
        """The data keys the batch's records are sealed under that are gone: not known here
        even after catching up (a key is published before anything sealed under it)."""
        knows = getattr(self.view.codec.cipher, "knows", None)
        keys = self.view.keys
        if knows is None or keys is None:
            return set()
        unknown = {kid_of(e.record.sealed) for e in events if e.record is not None and e.record.sealed}
        unknown = {k for k in unknown if not knows(k)}
        if unknown:
            await keys.catch_up()
            unknown = {k for k in unknown if not knows(k)}
        return unknown
