"""The memory ledger: the single writer per agent.

Commands are keyed by agent, so one partition owner decides every race for an agent.
Its state is a fold of its own output, `memlane.memory.events`, which is co-partitioned
with the commands: on assignment the ledger reads its partitions of the event log from
the start and folds them. The event log is therefore the ledger's changelog too, and
a command's events and its input offset commit in one Kafka transaction.

Once a `SubjectErased` is committed, the ledger destroys the subject's keys (`Erasures`); a
ledger that dies first does it when it recovers the partition, from the erasures its state
keeps. A recovery skips, and counts, the events it can no longer open.

Beside it: the idempotency window (`recent`), the recovery of a partition (`recovery`), the
snapshot bookkeeping (`snapshots`, the file itself in `snapshot_file`) and erasures (`erasures`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from aiokafka import TopicPartition
from pydantic import ValidationError

from events.base import utcnow
from events.codec import Codec, ContractError, from_validation_error
from events.errors import ErrorCode
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
    reused,
)
from events.rules.ledger.retention import due as retention_due
from events.rules.ledger.sweep import due as sweep_due
from events.rules.ledger.sweep import is_due, next_sweep
from events.sealing import KeyMissing
from events.topics import COMMANDS, EVENTS, REDELIVERED, REPLIES
from workers.processors.ledger.erasures import Erasures
from workers.processors.ledger.recent import CALLER, RecentCommands, logged
from workers.processors.ledger.recent import caller_of as caller_of  # re-exported: tests read events' callers
from workers.processors.ledger.recovery import Kept, known_gone, recover
from workers.processors.ledger.snapshots import Snapshots
from workers.runtime.metrics import RECORDS_EXPIRED, SWEEP_RECORDS, SWEEPS
from workers.runtime.runner import DeadLetter, Out, Processor, Stopping, metrics

log = structlog.get_logger()

# How long a revoked partition's state is kept for its return (a rebalance that hands it
# back folds only what another owner wrote meanwhile); past this, memory wins.
KEPT_S = 600.0


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

    def __init__(self, settings, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
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
        self.kept: dict[int, Kept] = {}
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

    async def _recover(self, partition: int) -> int:
        """Folds the partition's events (`recovery.recover`) and returns how many it folded."""
        return await recover(self, partition)

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
                return [Out(REPLIES.name, key, self.codec.encode(e), ((REDELIVERED, b"1"), named), partition=partition)
                        for e in reused(cmd)]
            # Effectively once: a redelivered command is answered with its first events, same
            # ids, on the replies topic; the event log keeps the first decision only.
            raws = seen[ck] if ck in seen.events else await logged(self.settings, partition, ck, seen.when(ck))
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
                known_gone(self.keys, e.kid)

    def _decided(self, state: LedgerState, cmd: Any, partition: int,
                 offset: int) -> tuple[list[Any], list[bytes], list[DeadLetter]]:
        """The command's events, or a refusal in their place when they cannot be written.

        One message must never stop the ledger: an event over the broker's limit would fail
        the transaction on every restart, and a rule that raises would do the same after
        the runner's retries. A refusal answers the caller at once; a failed rule also
        parks the command in the dead-letter topic for a look."""
        parked: list[DeadLetter] = []
        try:
            events = decide(state, cmd, self.turn_timeout, self.codec)
            raws = [self.codec.encode(e) for e in events]
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
        return events, [self.codec.encode(e) for e in events], parked

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
        return [Out(COMMANDS.name, COMMANDS.key_bytes(cmd), self.codec.encode(cmd))
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
