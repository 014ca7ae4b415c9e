"""The ledger's snapshot bookkeeping: when to snapshot a partition while it runs, and at which
offset of the event log a snapshot taken then ends (the file itself: `snapshot_file`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from events.codec import Codec
from events.rules.ledger import LedgerState
from events.topics import EVENTS
from workers.processors.ledger import snapshot_file
from workers.processors.ledger.recent import RecentCommands
from workers.processors.ledger.snapshot_file import Snapshot
from workers.runtime.runner import Out

if TYPE_CHECKING:
    from settings import Settings

log = structlog.get_logger()


class SnapshottingLedger(Protocol):
    """What the snapshot bookkeeping reads of the ledger that owns it: its settings, its
    partitions' states and recent commands, how many events a snapshot waits for, and the
    codec whose cipher seals it."""

    settings: Settings
    codec: Codec

    @property
    def states(self) -> Mapping[int, LedgerState]: ...

    @property
    def processed(self) -> Mapping[int, RecentCommands]: ...

    @property
    def snapshot_every(self) -> int: ...


class Snapshots:
    """When to snapshot a partition, and at which offset a snapshot taken then ends.

    A snapshot is taken between batches, when the state folds every event sent so far; the
    events' offsets are only known once their transaction commits. So it waits, encoded,
    until the commits have covered as many events of the partition as were sent when it was
    taken, and then ends after the last of them (batches commit one at a time, in order).
    """

    def __init__(self, ledger: SnapshottingLedger) -> None:
        self.ledger = ledger
        self.sent_n: Counter[int] = Counter()  # events sent per partition since its recovery
        self.last: dict[int, bytes] = {}  # the last of them
        self.since: Counter[int] = Counter()  # since the last snapshot
        self.acked: dict[int, tuple[int, int]] = {}  # partition -> (events committed, last offset)
        self.pending: dict[int, tuple[int, str, bytes]] = {}  # partition -> (sent_n, sha of last, state)
        # partition -> (next offset, sha of the event before it) where its recovery ended
        self.base: dict[int, tuple[int, str]] = {}
        self.topic = ledger.settings.topic(EVENTS.name)

    def forget(self, partition: int) -> None:
        for d in (self.sent_n, self.last, self.since, self.acked, self.pending, self.base):
            d.pop(partition, None)

    def folded_through(self, partition: int) -> tuple[int, str] | None:
        """(next offset, sha of the event before it) of what the partition's state folds, when
        every event sent since its recovery is committed; None when some are not (an aborted
        batch's decisions are in the state but not in the log) or it is not known."""
        sent = self.sent_n.get(partition, 0)
        if not sent:
            return self.base.get(partition)
        n, last = self.acked.get(partition, (0, -1))
        return (last + 1, snapshot_file.sha(self.last[partition])) if n == sent else None

    def sent(self, partition: int, outs: list[Out]) -> None:
        if outs:
            self.sent_n[partition] += len(outs)
            self.since[partition] += len(outs)
            self.last[partition] = outs[-1].value

    def take_due(self) -> None:
        for p, n in list(self.since.items()):
            state = self.ledger.states.get(p)
            if state is None or p in self.pending or n < max(self.ledger.snapshot_every, len(state.records)):
                continue
            recent = self.ledger.processed[p]
            try:
                body = snapshot_file.encode_state(state, recent.events, recent.callers, recent.at, recent.window(),
                                                  self.ledger.codec.cipher)
            except Exception as e:  # a snapshot only saves time: never stop the ledger for one
                log.error("ledger_snapshot_failed", partition=p, error=f"{type(e).__name__}: {e}")
                self.since[p] = 0
                continue
            self.pending[p] = (self.sent_n[p], snapshot_file.sha(self.last[p]), body)
            self.since[p] = 0
            self._write_if_committed(p)

    def committed(self, written: list[Any]) -> None:
        for meta in written:
            if meta.topic == self.topic:
                n, last = self.acked.get(meta.partition, (0, -1))
                self.acked[meta.partition] = (n + 1, max(last, meta.offset))
        for p in list(self.pending):
            self._write_if_committed(p)

    def _write_if_committed(self, p: int) -> None:
        want, digest, body = self.pending[p]
        n, last = self.acked.get(p, (0, -1))
        if n < want:
            return
        del self.pending[p]
        if n > want:  # cannot happen while batches commit in order; never guess an offset
            log.warning("ledger_snapshot_dropped", partition=p, sent=want, committed=n)
            return
        snap = Snapshot(snapshot_file.FORMAT, last + 1, digest, body)
        path = snapshot_file.path_for(self.ledger.settings, p)
        task = asyncio.get_running_loop().run_in_executor(None, snapshot_file.write, path, snap)
        task.add_done_callback(lambda f: f.exception() and log.error("ledger_snapshot_failed", partition=p,
                                                                      error=str(f.exception())))
        log.info("ledger_snapshot", partition=p, next_offset=last + 1, bytes=len(body))
