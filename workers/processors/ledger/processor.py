"""The memory ledger: the single writer per agent.

Commands are keyed by agent, so one partition owner decides every race for an agent.
Its state is a fold of its own output, `memlane.memory.events`, which is co-partitioned
with the commands: on assignment the ledger reads its partitions of the event log from
the start and folds them. The event log is therefore the ledger's changelog too, and
a command's events and its input offset commit in one Kafka transaction.

Once a `SubjectErased` is committed, the ledger destroys the subject's keys (`Erasures`); a
ledger that dies first does it when it recovers the partition, from the erasures its state
keeps. A recovery skips, and counts, the events it can no longer open.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import msgspec
import structlog
from aiokafka import TopicPartition
from pydantic import ValidationError

from events.base import utcnow
from events.codec import ContractError, encode, from_validation_error, opened
from events.errors import ErrorCode
from events.lean import LedgerView, decode_ledger_view
from events.rules.ledger import (
    LedgerState,
    caller,
    command_key,
    decide,
    evolve,
    forget,
    overdue,
    oversized,
    refused,
    restage,
    reused,
)
from events.rules.ledger.retention import due as retention_due
from events.rules.ledger.sweep import due as sweep_due
from events.rules.ledger.sweep import is_due, next_sweep
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import COMMANDS, EVENTS, REDELIVERED, REPLIES
from workers.processors.ledger import snapshot_file
from workers.processors.ledger.erasures import Erasures
from workers.processors.ledger.snapshot_file import Snapshot
from workers.runtime.data_keys import KeyTopic
from workers.runtime.heap import settle_heap
from workers.runtime.kafka_io import reader
from workers.runtime.metrics import RECORDS_EXPIRED, SWEEP_RECORDS, SWEEPS
from workers.runtime.runner import DeadLetter, Out, Processor, Stopping, metrics

log = structlog.get_logger()

# The idempotency window: a command redelivered (API retries reuse ids) within this time of its
# first decision gets its first events back. The events of the most recent commands are held,
# up to PROCESSED_BYTES per partition; of the older ones only when they were decided, their
# events read back from the log when one comes again. At most OLDER_MOST older commands per
# partition (about 300 bytes each, measured): past that the window is cut short, and logged
# (docs/decisions/0009-ledger-state-is-a-fold.md).
IDEMPOTENCY_S = 24 * 3600
PROCESSED_BYTES = 32 * 1024 * 1024
OLDER_MOST = 1_000_000
# How long a revoked partition's state is kept for its return (a rebalance that hands it
# back folds only what another owner wrote meanwhile); past this, memory wins.
KEPT_S = 600.0
# The header on each event the ledger writes for a command: who gave the command (`caller`).
# A recovery reads it back, so a restarted ledger still tells a retry from another caller's
# reuse of the id without the commands themselves. Copies (a redelivery's events, a reuse's
# refusal) carry it too, so a reader waiting on a command id can tell whose answer it is.
CALLER = "memlane-caller"


def _now_ms() -> int:
    return int(time.time() * 1000)


class RecentCommands:
    """The ledger's memory of the commands it decided within the idempotency window, per
    partition. Command key (`command_key`: tenant, agent and command id) -> the raw events it
    produced (`events`, oldest evicted first past `budget` bytes, a command's events kept or
    evicted together), who gave it (`callers`, the rules' `caller`) and when (`at`, ms). A
    command whose events were evicted stays in `older` (key -> (caller, when)) until `window_s`
    after it was decided. Keyed by the id alone, one agent's command id answered another's;
    answered without the caller, another member (or an operator) reusing a known id got the
    first caller's record back."""

    def __init__(self, budget: int = PROCESSED_BYTES, window_s: float = IDEMPOTENCY_S,
                 most: int = OLDER_MOST) -> None:
        self.budget, self.window_ms, self.most = budget, int(window_s * 1000), most
        self.events: OrderedDict[str, list[bytes]] = OrderedDict()
        # None: not known (events logged before callers were): matches no caller.
        self.callers: dict[str, str | None] = {}
        self.at: dict[str, int] = {}
        self.older: OrderedDict[str, tuple[str | None, int]] = OrderedDict()
        self.size = 0
        self.cut_ms = 0  # how far back the window reached when OLDER_MOST last cut it

    def __contains__(self, key: str) -> bool:
        return key in self.events or key in self.older

    def __getitem__(self, key: str) -> list[bytes]:
        """The events held for a recent command (an older one's are on the log: `when`)."""
        return self.events[key]

    def caller(self, key: str) -> str | None:
        return self.callers[key] if key in self.events else self.older[key][0]

    def when(self, key: str) -> int:
        return self.at[key] if key in self.events else self.older[key][1]

    def add(self, key: str, raw: bytes, caller: str | None = None, at_ms: int | None = None) -> None:
        """The first event a key gets names its caller and time. A recovery may file a later
        event under a key it did not start (a turn's outcome applies writes staged under their
        own command ids): that event's caller does not replace the key's."""
        if key not in self.events:
            self.callers[key] = caller
            self.at[key] = _now_ms() if at_ms is None else at_ms
            self.older.pop(key, None)
        self.events.setdefault(key, []).append(raw)
        self.size += len(raw)

    @classmethod
    def restored(cls, items: list[tuple[str, str | None, list[bytes]]], at: dict[str, int] | None = None,
                 older: list[tuple[str, str | None, int]] | None = None) -> RecentCommands:
        """From a snapshot's list of (key, caller, events), oldest first, and its window."""
        recent = cls()
        now = _now_ms()
        for key, who, when in older or ():
            recent.older[key] = (who, when)
        for key, who, raws in items:
            recent.events[key] = raws
            recent.callers[key] = who
            recent.at[key] = (at or {}).get(key, now)
            recent.size += sum(len(r) for r in raws)
        return recent

    def evict(self, now_ms: int | None = None) -> None:
        """Called between commands, so the newest command is never cut in half."""
        now_ms = _now_ms() if now_ms is None else now_ms
        while self.size > self.budget and len(self.events) > 1:
            key, raws = self.events.popitem(last=False)
            self.older[key] = (self.callers.pop(key, None), self.at.pop(key))
            self.size -= sum(len(r) for r in raws)
        since = now_ms - self.window_ms
        while self.older and next(iter(self.older.values()))[1] < since:
            self.older.popitem(last=False)
        if len(self.older) > self.most:
            while len(self.older) > self.most:
                self.older.popitem(last=False)
            reach = next(iter(self.older.values()))[1]
            if reach - self.cut_ms > 60_000:  # logged at most once a minute of reach
                self.cut_ms = reach
                log.warning("ledger_idempotency_window_cut", commands=self.most, window_s=round((now_ms - reach) / 1000))

    def window(self) -> list[tuple[str, str | None, int]]:
        """The older commands, oldest first, for a snapshot."""
        return [(k, who, at) for k, (who, at) in self.older.items()]


class _Envelope(msgspec.Struct):
    """What names an event's command, never sealed: read of an event that no longer opens."""

    tenant: str
    agent: str
    command_id: str


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def caller_of(headers: Any) -> str | None:
    """The caller an event of the log names (`CALLER`), if it names one."""
    for name, value in headers or ():
        if name == CALLER:
            return value.decode()
    return None


def next_retention(now: datetime, settings: Any, after_run: bool = False) -> datetime:
    """When retention runs next: every `retention_every_s` after a run, the first time at the
    next `retention_hour_utc` o'clock (a shorter interval, for tests, starts one interval on)."""
    every = timedelta(seconds=settings.retention_every_s)
    if after_run or every < timedelta(days=1):
        return now + every
    at = now.replace(hour=settings.retention_hour_utc, minute=0, second=0, microsecond=0)
    return at if at > now else at + timedelta(days=1)


class LedgerProcessor(Processor):
    name = "ledger"
    sources = (COMMANDS.name,)
    transactional = True
    # How often the ledger looks for turns whose writes waited past the turn timeout. A
    # turn times out one tick after its timeout at most.
    tick_every = 60.0
    # A partition's state is snapshotted once this many events were sent since the last
    # snapshot, and at least as many as it has records, so that writing snapshots costs
    # each event a bounded share however large the state grows.
    snapshot_every = 100_000

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.states: dict[int, LedgerState] = {}
        self.processed: dict[int, RecentCommands] = {}
        # What the current batch decided, for its summary line.
        self.decided = 0
        self.kinds: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.clock = utcnow
        # How long a turn's staged writes wait for its outcome before they are discarded.
        self.turn_timeout = timedelta(seconds=settings.turn_timeout_s)
        self.asked: set[str] = set()  # ExpireTurns sent and not yet decided
        self.snapshots = Snapshots(self)
        self.erasures = Erasures(self)
        self.recovering: dict[int, asyncio.Future] = {}
        self.epochs: Counter[int] = Counter()  # bumped when a partition is revoked
        # Revoked partitions' states that fold every event they sent (`Snapshots.folded_through`):
        # partition -> (when revoked, state, recent commands, next offset, sha of the event before it).
        self.kept: dict[int, tuple[float, LedgerState, RecentCommands, int, str]] = {}
        self.deciding: Counter[int] = Counter()  # commands being decided, per partition
        self.unreadable = 0  # events and snapshot entries skipped: sealed under destroyed keys
        self.next_retention = next_retention(self.clock(), settings)
        self.tick_every = min(self.tick_every, settings.retention_every_s)
        # The scheduled expiry sweep (`events.rules.ledger.sweep`), and the records named by
        # sweeps still waiting in the input (not named again until decided).
        self.next_sweep = next_sweep(self.clock(), settings.sweep_every_s)
        self.sweep_asked: set[str] = set()
        if settings.sweep_every_s > 0:
            self.tick_every = min(self.tick_every, settings.sweep_every_s)

    async def start(self) -> None:
        if self.keys is not None:
            self.keys.keyring.on_destroy.append(self._subject_destroyed)

    def _subject_destroyed(self, subject: str) -> None:
        """A key destroyed anywhere (another ledger's erasure too): what the held states keep of
        its subject is forgotten at once, so no snapshot or decision here seals it again."""
        now = self.clock()
        held = [*self.states.values(), *(k[1] for k in self.kept.values())]
        n = sum(forget(state, subject, until=now) for state in held)
        if n:
            log.info("ledger_forgot_destroyed_subject", records=n)

    async def assigned(self, consumer: Any, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            await self._recovered(tp.partition)

    async def _recovered(self, partition: int) -> None:
        """Recovers the partition unless its state is here, once however many ask.

        Why once: a poll can hand the worker a partition's commands while the assignment is
        still recovering other partitions, and the command recovers the partition itself.
        Two recoveries raced, and the later one installed a fold that missed the events the
        worker had decided meanwhile and not yet committed."""
        if partition in self.states:
            return
        task = self.recovering.get(partition)
        if task is None:
            task = self.recovering[partition] = asyncio.ensure_future(self._recover(partition))
            task.add_done_callback(lambda _: self.recovering.pop(partition, None))
        await task

    def not_ready(self, partitions: set[int]) -> list[str]:
        """Not ready while an assigned partition's state is still being folded (`_recover`)."""
        missing = sorted(p for p in partitions if p not in self.states)
        return [f"ledger recovering partitions {missing}"] if missing else []

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        now = asyncio.get_running_loop().time()
        self.kept = {p: k for p, k in self.kept.items() if now - k[0] < KEPT_S}
        for tp in partitions:
            self.epochs[tp.partition] += 1  # a recovery still running for it installs nothing
            through = self.snapshots.folded_through(tp.partition)
            if tp.partition in self.states and through is not None and not self.deciding[tp.partition]:
                # Every event it folds is committed: kept, a return folds only the gap.
                self.kept[tp.partition] = (now, self.states[tp.partition], self.processed[tp.partition], *through)
            self.states.pop(tp.partition, None)
            self.processed.pop(tp.partition, None)
            self.snapshots.forget(tp.partition)
            self.erasures.forget(tp.partition)

    async def stop(self) -> None:
        await self.erasures.settle()

    def _known_gone(self, kid: str) -> None:
        """A key still unknown after catching up was destroyed, and its tombstone compacted
        away: remembered as destroyed, so the next token under it does not catch up again."""
        if self.keys is not None and not self.keys.keyring.knows(kid):
            self.keys.keyring.destroyed.add(kid)

    async def _view(self, raw: bytes) -> LedgerView | None:
        """An event of the log as recovery folds it, or None when it no longer opens."""
        try:
            return decode_ledger_view(raw)
        except KeyDestroyed:
            return None
        except KeyMissing as e:
            if self.keys is None:
                raise
            await self.keys.catch_up()
            self._known_gone(e.kid)
        try:
            return decode_ledger_view(raw)
        except (KeyDestroyed, KeyMissing):
            return None

    async def _unopened_staged(self, state: LedgerState) -> int:
        """Drops the staged writes whose own fields no longer open (their member was erased), as
        the ledger that folded the erasure dropped them; returns how many. Only open turns hold any."""
        if self.keys is None:
            return 0
        n = 0
        for key, raws in list(state.staged.items()):
            kept = [raw for raw in raws if await self._opens(raw)]
            if len(kept) < len(raws):
                n += len(raws) - len(kept)
                restage(state, key, kept)
        return n

    async def _opens(self, raw: str) -> bool:
        for _ in range(2):
            try:
                opened(raw)
                return True
            except ContractError:
                return True  # not a key's doing: left as it was
            except KeyDestroyed:
                return False
            except KeyMissing as e:
                # A cast, not an assert: a KeyMissing with no keys fails as it always did.
                await cast(KeyTopic, self.keys).catch_up()
                self._known_gone(e.kid)
        return False

    async def _from_snapshot(self, c: Any, tp: TopicPartition, end: int, state: LedgerState,
                             seen: RecentCommands) -> tuple[LedgerState, RecentCommands, int, str]:
        """The partition's snapshot when there is a good one, with `c` at the offset after it
        (and the sha of the event before it); else the empty `state` and `seen` with `c` at the
        beginning."""
        partition = tp.partition
        snap = snapshot_file.read(snapshot_file.path_for(self.settings, partition))
        loaded = None
        if snap and snap.next_offset <= end and await _holds(c, tp, snap.next_offset - 1, snap.last_sha):
            if self.keys is not None:
                await self.keys.catch_up()  # a key it does not know after this was destroyed
            try:
                loaded = await asyncio.to_thread(snapshot_file.decode_state, snap.state)
                window = await asyncio.to_thread(snapshot_file.decode_window, snap.state)
            except ContractError as e:
                log.warning("ledger_snapshot_ignored", partition=partition, reason=str(e))
        elif snap:
            log.warning("ledger_snapshot_ignored", partition=partition, reason="the event it ends with is not in the log")
        if loaded is None:
            await c.seek_to_beginning(tp)
            return state, seen, 0, ""
        assert snap is not None  # only a snapshot is loaded
        state, recent, dropped = loaded
        if dropped:
            self.unreadable += dropped
            log.info("ledger_snapshot_entries_erased", partition=partition, entries=dropped)
        c.seek(tp, snap.next_offset)
        return state, RecentCommands.restored(recent, *window), snap.next_offset, snap.last_sha

    async def _recover(self, partition: int) -> int:
        """Folds the partition's events, after its snapshot when there is a good one, and
        returns how many it folded."""
        state, seen, epoch = LedgerState(), RecentCommands(), self.epochs[partition]
        topic = self.settings.topic(EVENTS.name)
        c = reader(self.settings, max_poll_records=2000)
        await c.start()
        n, last = 0, None
        try:
            tp = TopicPartition(topic, partition)
            c.assign([tp])
            end = (await c.end_offsets([tp]))[tp]
            start = 0
            kept = self.kept.pop(partition, None)
            if kept and kept[3] <= end and await _holds(c, tp, kept[3] - 1, kept[4]):
                # Handed back: the state it kept, and only what was written since it left.
                _, state, seen, start, before = kept
                c.seek(tp, start)
            else:
                state, seen, start, before = await self._from_snapshot(c, tp, end, state, seen)
            skipped = malformed = 0
            next_report = 100_000
            while await c.position(tp) < end:
                if self.stopping.is_set():
                    log.info("ledger_recovery_stopped", partition=partition, events=n, of=end)
                    return n
                batch = await c.getmany(tp, timeout_ms=1000, max_records=2000)
                for m in batch.get(tp, []):
                    n, last = n + 1, m
                    if (REDELIVERED, b"1") in (m.headers or ()):
                        # Its original came first and was folded. Folded again, a staged
                        # write would be staged twice (and applied twice) on recovery only.
                        continue
                    try:
                        event: LedgerView | _Envelope | None = await self._view(m.value)
                    except ContractError:
                        # Not an event the ledger wrote (another producer's bytes on its log):
                        # nothing to fold, and the partition must still recover. The offset
                        # alone is logged: the bytes may hold anything.
                        malformed += 1
                        log.warning("ledger_recovery_skipped_malformed_event", partition=partition, offset=m.offset)
                        continue
                    if event is None:  # sealed under a destroyed key: its subject was erased
                        skipped += 1
                        event = _ENVELOPE.decode(m.value)
                    else:
                        evolve(state, event)
                    seen.add(command_key(event.tenant, event.agent, event.command_id), m.value, caller_of(m.headers),
                             m.timestamp)
                seen.evict()
                settle_heap()
                if n >= next_report:
                    log.info("ledger_recovering", partition=partition, events=n, of=end)
                    next_report += 100_000
        finally:
            await c.stop()
        skipped += await self._unopened_staged(state)
        if last is not None and n >= self.snapshot_every:
            # What it folded, so the next recovery starts here. Encoded before the state is
            # installed: once it is, commands change it.
            pending = {r.kid for r in self.keys.keyring.pending} if self.keys is not None else set()
            try:
                body = await asyncio.to_thread(snapshot_file.encode_state, state, seen.events, seen.callers, seen.at,
                                               seen.window())
                if self.keys is not None and any(r.kid not in pending for r in self.keys.keyring.pending):
                    # It sealed under a key not published yet: written now, a crash before the next
                    # commit publishes the key would leave a snapshot whose entries never open.
                    log.info("ledger_snapshot_deferred", partition=partition, reason="new keys")
                else:
                    await asyncio.to_thread(snapshot_file.write, snapshot_file.path_for(self.settings, partition),
                                            Snapshot(snapshot_file.FORMAT, last.offset + 1,
                                                     snapshot_file.sha(last.value), body))
            except Exception as e:  # a snapshot only saves time
                log.warning("ledger_snapshot_failed", partition=partition, error=f"{type(e).__name__}: {e}")
        if self.epochs[partition] != epoch:
            return n
        self.states[partition], self.processed[partition] = state, seen
        self.snapshots.forget(partition)  # counts start from the recovered state
        self.snapshots.base[partition] = (last.offset + 1, snapshot_file.sha(last.value)) if last else (start, before)
        self.unreadable += skipped
        log.info("ledger_recovered", partition=partition, events=n, from_offset=start, records=len(state.records),
                 **({"unreadable": skipped} if skipped else {}), **({"malformed": malformed} if malformed else {}))
        if state.erasures:
            # A ledger that died between an erasure's commit and its keys' destruction did not
            # destroy them: done again (what is gone stays gone; keys made later stay).
            self.erasures.destroy(list(state.erasures.items()), recovered=True)
        return n

    async def process(self, source: str, partition: int, offset: int, cmd: Any) -> Sequence[Out | DeadLetter]:
        self.deciding[partition] += 1
        try:
            return await self._process(partition, offset, cmd)
        finally:
            self.deciding[partition] -= 1

    async def _process(self, partition: int, offset: int, cmd: Any) -> Sequence[Out | DeadLetter]:
        state = self.states.get(partition)
        if state is None:
            await self._recovered(partition)
            if partition not in self.states:
                raise Stopping(f"ledger stopped while recovering partition {partition}")
            state = self.states[partition]
        seen = self.processed[partition]
        key = EVENTS.key_bytes(cmd)
        ck = command_key(cmd.tenant, cmd.agent, cmd.command_id)
        who = caller(cmd)
        named = (CALLER, who.encode())  # on every event written for this command, copies too
        if ck in seen:
            if seen.caller(ck) != who:
                # Another caller reusing a known id gets a refusal, never the first caller's
                # events. Marked as a copy: no fold, no projection and no recovery takes it for
                # the id's own events; the caller waiting on the id still gets it.
                log.warning("command_id_reused", command_id=cmd.command_id, agent=cmd.agent, partition=partition,
                            offset=offset)
                return [Out(REPLIES.name, key, encode(e), ((REDELIVERED, b"1"), named), partition=partition)
                        for e in reused(cmd)]
            # Effectively once: a redelivered command is answered with its first events, same
            # ids, on the replies topic; the event log keeps the first decision only.
            raws = seen[ck] if ck in seen.events else await self._logged(partition, ck, seen.when(ck))
            if raws:
                log.info("command_redelivered", command_id=cmd.command_id, partition=partition, offset=offset)
                return [Out(REPLIES.name, key, raw, ((REDELIVERED, b"1"), named), partition=partition) for raw in raws]
            # Not found where it was logged (it cannot be, short of a log cut by hand): decided as
            # new, which refuses an id that made a record.
            log.warning("command_redelivered_events_missing", command_id=cmd.command_id, partition=partition)
        events, raws, parked = await self._deciding(state, cmd, partition, offset)
        outs = [Out(EVENTS.name, key, raw, (named,)) for raw in raws]
        # Per command at debug level, and a summary per batch (`batch_done`): a line per event
        # was a sixth of the ledger's CPU at a few hundred turns per second, and the events
        # themselves, with their provenance, are in the log.
        rejected = [e.reason for e in events if e.type == "CommandRejected"]
        log.debug(
            "ledger_decided",
            kinds=[e.type for e in events],
            event_ids=[e.event_id for e in events],
            command_id=cmd.command_id,
            agent=cmd.agent,
            partition=partition,
            offset=offset,
            **({"reasons": rejected} if rejected else {}),
        )
        self.decided += 1
        self.kinds.update(e.type for e in events)
        self.rejections.update(rejected)
        metrics.LEDGER_COMMANDS.labels(type(cmd).__name__).inc()
        for e in events:
            if e.type == "CommandRejected":
                metrics.LEDGER_REJECTIONS.labels(e.code).inc()
        # Fold last: nothing above may fail after the state has moved.
        for e, o in zip(events, outs):
            evolve(state, e)
            seen.add(ck, o.value, who)
        seen.evict()
        self.snapshots.sent(partition, outs)
        self.erasures.sent(partition, events)
        return [*outs, *parked]

    async def _logged(self, partition: int, ck: str, at_ms: int) -> list[bytes]:
        """An older command's events, read back from the log: from the first message stamped a
        second before its decision, on until a minute past it (its events commit in one
        transaction, with that batch's other commands)."""
        c = reader(self.settings, max_poll_records=500)
        await c.start()
        try:
            tp = TopicPartition(self.settings.topic(EVENTS.name), partition)
            c.assign([tp])
            found = (await c.offsets_for_times({tp: max(0, at_ms - 1000)}))[tp]
            end = (await c.end_offsets([tp]))[tp]
            if found is None:
                return []
            c.seek(tp, found.offset)
            raws: list[bytes] = []
            while await c.position(tp) < end:
                for m in (await c.getmany(tp, timeout_ms=1000, max_records=500)).get(tp, []):
                    if m.timestamp > at_ms + 60_000:
                        return raws
                    if (REDELIVERED, b"1") in (m.headers or ()):
                        continue
                    try:
                        e = _ENVELOPE.decode(m.value)
                    except msgspec.MsgspecError:  # not an event the ledger wrote
                        continue
                    if command_key(e.tenant, e.agent, e.command_id) == ck:
                        raws.append(m.value)
            return raws
        finally:
            await c.stop()

    async def _deciding(self, state: LedgerState, cmd: Any, partition: int,
                        offset: int) -> tuple[list[Any], list[bytes], list[DeadLetter]]:
        """`_decided`, caught up on the keys when a staged write names a key not known here yet.
        A key still unknown then was destroyed: the rules then skip the write it sealed."""
        while True:
            try:
                return self._decided(state, cmd, partition, offset)
            except KeyMissing as e:
                if self.keys is None:
                    raise
                await self.keys.catch_up()
                self._known_gone(e.kid)

    def _decided(self, state: LedgerState, cmd: Any, partition: int,
                 offset: int) -> tuple[list[Any], list[bytes], list[DeadLetter]]:
        """The command's events, or a refusal in their place when they cannot be written.

        One message must never stop the ledger: an event over the broker's limit would fail
        the transaction on every restart, and a rule that raises would do the same after
        the runner's retries. A refusal answers the caller at once; a failed rule also
        parks the command in the dead-letter topic for a look."""
        parked: list[DeadLetter] = []
        try:
            events = decide(state, cmd, self.turn_timeout)
            raws = [encode(e) for e in events]
            instead = oversized(cmd, raws)
            if instead is None:
                return events, raws, parked
            log.warning("command_too_large", command_id=cmd.command_id, field=instead[0].field, partition=partition,
                        offset=offset)
            events = instead
        except KeyMissing:
            raise
        except (ValidationError, ContractError) as e:
            err = from_validation_error(e) if isinstance(e, ValidationError) else e
            log.warning("command_invalid", command_id=cmd.command_id, field=err.field, partition=partition, offset=offset)
            events = refused(cmd, ErrorCode.VALIDATION_FAILED, err.field or None, str(err))
        except Exception as e:
            log.exception("command_failed", command_id=cmd.command_id, error=type(e).__name__, partition=partition,
                          offset=offset)
            reason = f"the ledger could not apply this command ({type(e).__name__}); it was parked for an operator"
            events, parked = refused(cmd, ErrorCode.COMMAND_FAILED, None, reason), [DeadLetter(f"{type(e).__name__}: {e}")]
        return events, [encode(e) for e in events], parked

    async def tick(self) -> list[Out]:
        """An `ExpireTurns` command for each agent with an overdue turn, sent to the ledger's
        own input: the decision is then a command in the log like any other, and a replay
        decides it the same. A command already asked for is not asked for again while it
        waits in the partition (a backlog can hold it longer than a tick)."""
        now = self.clock()
        due = [cmd for state in self.states.values() for cmd in overdue(state, now, self.turn_timeout)]
        self.asked &= {cmd.command_id for cmd in due}
        new = [cmd for cmd in due if cmd.command_id not in self.asked]
        if new:
            log.info("turns_overdue", agents=len(new))
        self.asked |= {cmd.command_id for cmd in new}
        return [Out(COMMANDS.name, COMMANDS.key_bytes(cmd), encode(cmd))
                for cmd in new + self._retention(now) + self._sweep(now)]

    def _sweep(self, now: datetime) -> list[Any]:
        """The scheduled expiry sweep of the partitions held here, once due: `SweepExpired`
        commands for the ledger's own input, decided like any other (docs/operations/scheduled-jobs.md)."""
        if not is_due(now, self.next_sweep):
            return []
        self.next_sweep = next_sweep(now, self.settings.sweep_every_s)
        sweeps = [sweep_due(state, now, self.sweep_asked) for state in self.states.values()]
        self.sweep_asked = {k for s in sweeps for k in s.waiting | s.names}
        cmds = [c for s in sweeps for c in s.commands]
        named = sum(len(s.names) for s in sweeps)
        SWEEPS.inc()
        SWEEP_RECORDS.inc(named)
        if cmds:
            assert self.next_sweep is not None  # sweeps are on: the one just due had a time
            log.info("sweep_due", commands=len(cmds), records=named, next_at=self.next_sweep.isoformat())
        return cmds

    def _retention(self, now: datetime) -> list[Any]:
        """The night's retention work (`events.rules.ledger.retention`) for the partitions held
        here, once the scheduled time has come; sent to the ledger's own input like ExpireTurns."""
        if now < self.next_retention:
            return []
        self.next_retention = next_retention(now, self.settings, after_run=True)
        cap = self.settings.retention_cap
        nights = [retention_due(state, now, cap=cap) for state in self.states.values()]
        cmds = [c for n in nights for c in n.commands]
        log.info("retention_due", commands=len(cmds), expired=sum(n.expired for n in nights),
                 superseded=sum(n.superseded for n in nights), purged=sum(n.purged for n in nights),
                 deferred=sum(n.deferred for n in nights), next_at=self.next_retention.isoformat())
        return cmds

    def committed(self, written: list[Any]) -> None:
        self.snapshots.committed(written)
        self.erasures.committed()

    async def batch_done(self) -> list[Out]:
        self.snapshots.take_due()
        if self.decided:
            RECORDS_EXPIRED.inc(self.kinds["RecordExpired"])
            log.info("ledger_batch", commands=self.decided, events=dict(self.kinds), rejected=dict(self.rejections))
            self.decided, self.kinds, self.rejections = 0, Counter(), Counter()
        return []


async def _holds(c: Any, tp: TopicPartition, offset: int, digest: str) -> bool:
    """Whether the event at `offset` is the one a snapshot says it folded last."""
    if offset < 0:
        return True
    c.seek(tp, offset)
    for _ in range(10):
        msgs = (await c.getmany(tp, timeout_ms=1000, max_records=1)).get(tp, [])
        if msgs:
            return msgs[0].offset == offset and snapshot_file.sha(msgs[0].value) == digest
    return False


class Snapshots:
    """When to snapshot a partition, and at which offset a snapshot taken then ends.

    A snapshot is taken between batches, when the state folds every event sent so far; the
    events' offsets are only known once their transaction commits. So it waits, encoded,
    until the commits have covered as many events of the partition as were sent when it was
    taken, and then ends after the last of them (batches commit one at a time, in order).
    """

    def __init__(self, ledger: LedgerProcessor) -> None:
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
                body = snapshot_file.encode_state(state, recent.events, recent.callers, recent.at, recent.window())
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
