"""The live path: each agent's records of a segment are applied by one APPLY call that checks
the versions. On one server the segment's scripts and the projection's checkpoint go in one
MULTI/EXEC (the tracking record lives with the view); on a cluster the checkpoint follows the
agents' scripts, which a replay applies again without changing anything."""

from __future__ import annotations

import json
from typing import Any

from events.lean import LeanEvent
from projections.redis.connection import write_then
from projections.redis.record_view_fold import FoldBatch, FoldView, Row, checkpoints, fold
from projections.redis.record_view_keys import APPLY_KINDS, agent_key, apply_keys, user_list_prefix
from projections.redis.record_view_scripts import APPLY, CHECKPOINT, USAGE


class LiveBatch(FoldBatch):
    """A segment's records gathered per agent, as APPLY's arguments; the rest of the fold (one
    key each) goes on `pipe` and out before the scripts."""

    def __init__(self, view: FoldView, pipe: Any, ns: str) -> None:
        super().__init__(view, pipe, ns)
        self.rows: dict[str, list[Any]] = {}  # agent key -> APPLY's 8 arguments per event

    def record(self, r: Row) -> None:
        self.rows.setdefault(r.agent, []).extend(r[1:])


class LiveWrites:
    """The live worker's writes: a segment folded, then its scripts and checkpoint."""

    def __init__(self, view: FoldView) -> None:
        self.view = view
        self._apply = view.r.register_script(APPLY)
        self._checkpoint = view.r.register_script(CHECKPOINT)
        self._usage = view.r.register_script(USAGE)

    async def segment(self, ns: str, events: list[LeanEvent], gone: set[str],
                      positions: list[tuple[str, int]] | None) -> None:
        if not events and positions is None:
            return
        batch = LiveBatch(self.view, self.view.r.pipeline(transaction=False), ns)
        await fold(batch, events, gone)
        await batch.send()
        ckpt = checkpoints(positions)

        def checkpoint(p: Any) -> None:
            if ckpt:
                p.execute_command("EVALSHA", self._checkpoint.sha, 1, f"{ns}:ckpt", json.dumps(ckpt))

        await write_then(self.view.r, lambda p: self._scripts(p, batch), checkpoint,
                         scripts=(self._apply, self._checkpoint, self._usage))

    def _scripts(self, p: Any, batch: LiveBatch) -> None:
        """An APPLY per agent with records or announced changes, then a USAGE per agent with
        usage totals."""
        ns, changed = batch.ns, batch.changed
        channel = self.view.applied_channel if self.view.announce else ""
        agents = list(batch.rows) + [ak for ak in changed if ak not in batch.rows]
        for ak in agents:
            # execute_command: redis-py's cluster pipeline refuses its evalsha() method.
            p.execute_command("EVALSHA", self._apply.sha, len(APPLY_KINDS), *apply_keys(ns, ak),
                              user_list_prefix(ns, ak), channel, json.dumps(changed.get(ak, [])), ak,
                              *batch.rows.get(ak, ()))
        for ak, totals in batch.used.items():
            p.execute_command("EVALSHA", self._usage.sha, 1, agent_key(ns, "usage", ak),
                              *[x for kv in sorted(totals.items()) for x in kv])
