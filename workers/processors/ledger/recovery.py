"""The ledger's recovery of a partition: its state folded again from the event log, after the
state it kept when the partition was revoked, or its snapshot, when the log still holds the
event either ends with. What no longer opens (sealed under a destroyed key) is skipped and
counted; what was never the ledger's is skipped and logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from aiokafka import TopicPartition

from events.codec import Codec, ContractError
from events.lean import LedgerView, decode_ledger_view
from events.rules.ledger import LedgerState, command_key, evolve, restage
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS, REDELIVERED
from workers.processors.ledger import snapshot_file
from workers.processors.ledger.erasures import Erasures
from workers.processors.ledger.recent import ENVELOPE, Envelope, RecentCommands, caller_of
from workers.processors.ledger.snapshot_file import Snapshot
from workers.processors.ledger.snapshots import Snapshots
from workers.runtime.data_keys import KeyTopic
from workers.runtime.heap import settle_heap
from workers.runtime.kafka_io import reader

if TYPE_CHECKING:
    from settings import Settings

log = structlog.get_logger()

# A revoked partition's state, kept for its return: (when revoked, state, recent commands,
# next offset, sha of the event before it).
Kept = tuple[float, LedgerState, RecentCommands, int, str]


class RecoveringLedger(Protocol):
    """What a recovery reads and sets of the ledger that owns it: its settings, data keys and
    stop signal, the partitions' states, recent commands and kept states, the revocation count
    per partition, its snapshot and erasure bookkeeping, and the count of unreadable events."""

    settings: Settings
    codec: Codec
    keys: KeyTopic | None
    stopping: asyncio.Event
    unreadable: int

    @property
    def snapshot_every(self) -> int: ...

    @property
    def states(self) -> MutableMapping[int, LedgerState]: ...

    @property
    def processed(self) -> MutableMapping[int, RecentCommands]: ...

    @property
    def kept(self) -> MutableMapping[int, Kept]: ...

    @property
    def epochs(self) -> Mapping[int, int]: ...

    @property
    def snapshots(self) -> Snapshots: ...

    @property
    def erasures(self) -> Erasures: ...


def known_gone(keys: KeyTopic | None, kid: str) -> None:
    """A key still unknown after catching up was destroyed, and its tombstone compacted
    away: remembered as destroyed, so the next token under it does not catch up again."""
    if keys is not None and not keys.keyring.knows(kid):
        keys.keyring.destroyed.add(kid)


async def view(codec: Codec, keys: KeyTopic | None, raw: bytes) -> LedgerView | None:
    """An event of the log as recovery folds it, or None when it no longer opens."""
    try:
        return decode_ledger_view(raw, codec)
    except KeyDestroyed:
        return None
    except KeyMissing as e:
        if keys is None:
            raise
        await keys.catch_up()
        known_gone(keys, e.kid)
    try:
        return decode_ledger_view(raw, codec)
    except (KeyDestroyed, KeyMissing):
        return None


async def unopened_staged(codec: Codec, keys: KeyTopic | None, state: LedgerState) -> int:
    """Drops the staged writes whose own fields no longer open (their member was erased), as
    the ledger that folded the erasure dropped them; returns how many. Only open turns hold any."""
    if keys is None:
        return 0
    n = 0
    for key, raws in list(state.staged.items()):
        kept = [raw for raw in raws if await _opens(codec, keys, raw)]
        if len(kept) < len(raws):
            n += len(raws) - len(kept)
            restage(state, key, kept)
    return n


async def _opens(codec: Codec, keys: KeyTopic, raw: str) -> bool:
    for _ in range(2):
        try:
            codec.opened(raw)
            return True
        except ContractError:
            return True  # not a key's doing: left as it was
        except KeyDestroyed:
            return False
        except KeyMissing as e:
            await keys.catch_up()
            known_gone(keys, e.kid)
    return False


async def holds(c: Any, tp: TopicPartition, offset: int, digest: str) -> bool:
    """Whether the event at `offset` is the one a snapshot says it folded last."""
    if offset < 0:
        return True
    c.seek(tp, offset)
    for _ in range(10):
        msgs = (await c.getmany(tp, timeout_ms=1000, max_records=1)).get(tp, [])
        if msgs:
            return msgs[0].offset == offset and snapshot_file.sha(msgs[0].value) == digest
    return False


async def from_snapshot(ledger: RecoveringLedger, c: Any, tp: TopicPartition,
                        end: int) -> tuple[LedgerState, RecentCommands, int, str]:
    """The partition's snapshot when there is a good one, with `c` at the offset after it
    (and the sha of the event before it); else an empty state and window with `c` at the
    beginning."""
    partition = tp.partition
    snap = snapshot_file.read(snapshot_file.path_for(ledger.settings, partition))
    loaded = None
    if snap and snap.next_offset <= end and await holds(c, tp, snap.next_offset - 1, snap.last_sha):
        if ledger.keys is not None:
            await ledger.keys.catch_up()  # a key it does not know after this was destroyed
        try:
            loaded = await asyncio.to_thread(snapshot_file.decode_state, snap.state, ledger.codec.cipher)
            window = await asyncio.to_thread(snapshot_file.decode_window, snap.state)
        except ContractError as e:
            log.warning("ledger_snapshot_ignored", partition=partition, reason=str(e))
    elif snap:
        log.warning("ledger_snapshot_ignored", partition=partition, reason="the event it ends with is not in the log")
    if loaded is None:
        await c.seek_to_beginning(tp)
        return LedgerState(), RecentCommands(), 0, ""
    assert snap is not None  # only a snapshot is loaded
    state, recent, dropped = loaded
    if dropped:
        ledger.unreadable += dropped
        log.info("ledger_snapshot_entries_erased", partition=partition, entries=dropped)
    c.seek(tp, snap.next_offset)
    return state, RecentCommands.restored(recent, *window), snap.next_offset, snap.last_sha


class _Fold:
    """A partition's events folded in log order: the state and recent commands they make, how
    many were read and the last of them, and how many could not be folded."""

    def __init__(self, partition: int, state: LedgerState, seen: RecentCommands) -> None:
        self.partition, self.state, self.seen = partition, state, seen
        self.n = 0
        self.last: Any = None  # the last message read
        self.skipped = 0  # sealed under a destroyed key
        self.malformed = 0  # not an event the ledger wrote
        self.stopped = False  # the ledger stopped before the end

    async def message(self, codec: Codec, keys: KeyTopic | None, m: Any) -> None:
        self.n, self.last = self.n + 1, m
        if (REDELIVERED, b"1") in (m.headers or ()):
            # Its original came first and was folded. Folded again, a staged
            # write would be staged twice (and applied twice) on recovery only.
            return
        try:
            event: LedgerView | Envelope | None = await view(codec, keys, m.value)
        except ContractError:
            # Not an event the ledger wrote (another producer's bytes on its log):
            # nothing to fold, and the partition must still recover. The offset
            # alone is logged: the bytes may hold anything.
            self.malformed += 1
            log.warning("ledger_recovery_skipped_malformed_event", partition=self.partition, offset=m.offset)
            return
        if event is None:  # sealed under a destroyed key: its subject was erased
            self.skipped += 1
            event = ENVELOPE.decode(m.value)
        else:
            evolve(self.state, event)
        self.seen.add(command_key(event.tenant, event.agent, event.command_id), m.value, caller_of(m.headers),
                      m.timestamp)


async def _starting_point(ledger: RecoveringLedger, c: Any, tp: TopicPartition,
                          end: int) -> tuple[LedgerState, RecentCommands, int, str]:
    """Where the fold starts, with `c` there: the state kept when the partition was revoked, if
    the log still holds the event it ends with; else the snapshot (`from_snapshot`)."""
    kept = ledger.kept.pop(tp.partition, None)
    if kept and kept[3] <= end and await holds(c, tp, kept[3] - 1, kept[4]):
        # Handed back: the state it kept, and only what was written since it left.
        _, state, seen, start, before = kept
        c.seek(tp, start)
        return state, seen, start, before
    return await from_snapshot(ledger, c, tp, end)


async def _fold_to(ledger: RecoveringLedger, c: Any, tp: TopicPartition, end: int, fold: _Fold) -> None:
    """Folds the log from `c`'s position up to `end`, unless the ledger stops first."""
    next_report = 100_000
    while await c.position(tp) < end:
        if ledger.stopping.is_set():
            log.info("ledger_recovery_stopped", partition=fold.partition, events=fold.n, of=end)
            fold.stopped = True
            return
        batch = await c.getmany(tp, timeout_ms=1000, max_records=2000)
        for m in batch.get(tp, []):
            await fold.message(ledger.codec, ledger.keys, m)
        fold.seen.evict()
        settle_heap()
        if fold.n >= next_report:
            log.info("ledger_recovering", partition=fold.partition, events=fold.n, of=end)
            next_report += 100_000


async def _snapshot_folded(ledger: RecoveringLedger, fold: _Fold) -> None:
    """What it folded, so the next recovery starts here. Encoded before the state is
    installed: once it is, commands change it."""
    state, seen, last = fold.state, fold.seen, fold.last
    pending = {r.kid for r in ledger.keys.keyring.pending} if ledger.keys is not None else set()
    try:
        body = await asyncio.to_thread(snapshot_file.encode_state, state, seen.events, seen.callers, seen.at,
                                       seen.window(), ledger.codec.cipher)
        if ledger.keys is not None and any(r.kid not in pending for r in ledger.keys.keyring.pending):
            # It sealed under a key not published yet: written now, a crash before the next
            # commit publishes the key would leave a snapshot whose entries never open.
            log.info("ledger_snapshot_deferred", partition=fold.partition, reason="new keys")
        else:
            await asyncio.to_thread(snapshot_file.write, snapshot_file.path_for(ledger.settings, fold.partition),
                                    Snapshot(snapshot_file.FORMAT, last.offset + 1, snapshot_file.sha(last.value), body))
    except Exception as e:  # a snapshot only saves time
        log.warning("ledger_snapshot_failed", partition=fold.partition, error=f"{type(e).__name__}: {e}")


def _install(ledger: RecoveringLedger, fold: _Fold, start: int, before: str) -> None:
    """The recovered state becomes the partition's, and the erasures it holds are done again."""
    partition, state, last = fold.partition, fold.state, fold.last
    ledger.states[partition], ledger.processed[partition] = state, fold.seen
    ledger.snapshots.forget(partition)  # counts start from the recovered state
    ledger.snapshots.base[partition] = (last.offset + 1, snapshot_file.sha(last.value)) if last else (start, before)
    ledger.unreadable += fold.skipped
    log.info("ledger_recovered", partition=partition, events=fold.n, from_offset=start, records=len(state.records),
             **({"unreadable": fold.skipped} if fold.skipped else {}),
             **({"malformed": fold.malformed} if fold.malformed else {}))
    if state.erasures:
        # A ledger that died between an erasure's commit and its keys' destruction did not
        # destroy them: done again (what is gone stays gone; keys made later stay).
        ledger.erasures.destroy(list(state.erasures.items()), recovered=True)


async def recover(ledger: RecoveringLedger, partition: int) -> int:
    """Folds the partition's events, after its kept state or snapshot when there is a good
    one, installs the state unless the partition was revoked meanwhile, and returns how many
    events it folded."""
    epoch = ledger.epochs[partition]
    c = reader(ledger.settings, max_poll_records=2000)
    await c.start()
    try:
        tp = TopicPartition(ledger.settings.topic(EVENTS.name), partition)
        c.assign([tp])
        end = (await c.end_offsets([tp]))[tp]
        state, seen, start, before = await _starting_point(ledger, c, tp, end)
        fold = _Fold(partition, state, seen)
        await _fold_to(ledger, c, tp, end, fold)
    finally:
        await c.stop()
    if fold.stopped:
        return fold.n
    fold.skipped += await unopened_staged(ledger.codec, ledger.keys, state)
    if fold.last is not None and fold.n >= ledger.snapshot_every:
        await _snapshot_folded(ledger, fold)
    if ledger.epochs[partition] != epoch:
        return fold.n
    _install(ledger, fold, start, before)
    return fold.n
