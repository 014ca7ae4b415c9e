"""The memory ledger: the single writer per agent.

Commands are keyed by agent, so one partition owner decides every race for an agent.
Its state is a fold of its own output, `memlane.memory.events`, which is co-partitioned
with the commands: on assignment the ledger reads its partitions of the event log from
the start and folds them. The event log is therefore the ledger's changelog too, and
a command's events and its input offset commit in one Kafka transaction.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.base import utcnow
from events.codec import encode
from events.lean import decode_ledger_view
from events.topics import COMMANDS, EVENTS, REDELIVERED
from workers.heap import settle_heap
from workers.kafka_io import reader
from workers.ledger_rules import LedgerState, decide, evolve, overdue
from workers.runtime import Out, Processor, Stopping

log = structlog.get_logger()

# The events of recent commands, per partition, re-sent as they were when a command is
# redelivered (API retries reuse ids). Bounded by bytes, not by count: a staged write's or
# a new record's event is 1.2-1.3 kB, so 200,000 commands of extraction turns kept about
# 300 MB per partition.
PROCESSED_BYTES = 32 * 1024 * 1024


class RecentCommands:
    """Command id -> the raw events it produced, oldest evicted first past `budget` bytes.
    A command's events are kept or evicted together."""

    def __init__(self, budget: int = PROCESSED_BYTES) -> None:
        self.budget = budget
        self.events: OrderedDict[str, list[bytes]] = OrderedDict()
        self.size = 0

    def __contains__(self, command_id: str) -> bool:
        return command_id in self.events

    def __getitem__(self, command_id: str) -> list[bytes]:
        return self.events[command_id]

    def add(self, command_id: str, raw: bytes) -> None:
        self.events.setdefault(command_id, []).append(raw)
        self.size += len(raw)

    def evict(self) -> None:
        """Called between commands, so the newest command is never cut in half."""
        while self.size > self.budget and len(self.events) > 1:
            _, raws = self.events.popitem(last=False)
            self.size -= sum(len(r) for r in raws)


class LedgerProcessor(Processor):
    name = "ledger"
    sources = (COMMANDS.name,)
    transactional = True
    # How often the ledger looks for turns whose writes waited past the turn timeout. A
    # turn times out one tick after its timeout at most.
    tick_every = 60.0

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.states: dict[int, LedgerState] = {}
        self.processed: dict[int, RecentCommands] = {}
        # What the current batch decided, for its summary line.
        self.decided = 0
        self.kinds: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.clock = utcnow
        self.asked: set[str] = set()  # ExpireTurns sent and not yet decided

    async def assigned(self, consumer: Any, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            if tp.partition not in self.states:
                await self._recover(tp.partition)

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self.states.pop(tp.partition, None)
            self.processed.pop(tp.partition, None)

    async def _recover(self, partition: int) -> None:
        state, seen = LedgerState(), RecentCommands()
        topic = self.settings.topic(EVENTS.name)
        c = reader(self.settings, max_poll_records=2000)
        await c.start()
        n = 0
        try:
            tp = TopicPartition(topic, partition)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            end = (await c.end_offsets([tp]))[tp]
            next_report = 100_000
            while await c.position(tp) < end:
                if self.stopping.is_set():
                    log.info("ledger_recovery_stopped", partition=partition, events=n, of=end)
                    return
                batch = await c.getmany(tp, timeout_ms=1000, max_records=2000)
                for m in batch.get(tp, []):
                    event = decode_ledger_view(m.value)
                    evolve(state, event)
                    seen.add(event.command_id, m.value)
                    n += 1
                seen.evict()
                settle_heap()
                if n >= next_report:
                    log.info("ledger_recovering", partition=partition, events=n, of=end)
                    next_report += 100_000
        finally:
            await c.stop()
        self.states[partition], self.processed[partition] = state, seen
        log.info("ledger_recovered", partition=partition, events=n, records=len(state.records))

    async def process(self, source: str, partition: int, offset: int, cmd: Any) -> list[Out]:
        state = self.states.get(partition)
        if state is None:
            await self._recover(partition)
            if partition not in self.states:
                raise Stopping(f"ledger stopped while recovering partition {partition}")
            state = self.states[partition]
        seen = self.processed[partition]
        key = EVENTS.key_bytes(cmd)
        if cmd.command_id in seen:
            # Effectively once: a redelivered command re-emits its stored events, same ids.
            log.info("command_redelivered", command_id=cmd.command_id, partition=partition, offset=offset)
            return [Out(EVENTS.name, key, raw, ((REDELIVERED, b"1"),)) for raw in seen[cmd.command_id]]
        events = decide(state, cmd)
        outs = [Out(EVENTS.name, key, encode(e)) for e in events]
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
        # Fold last: nothing above may fail after the state has moved.
        for e, o in zip(events, outs):
            evolve(state, e)
            seen.add(cmd.command_id, o.value)
        seen.evict()
        return outs

    async def tick(self) -> list[Out]:
        """An `ExpireTurns` command for each agent with an overdue turn, sent to the ledger's
        own input: the decision is then a command in the log like any other, and a replay
        decides it the same. A command already asked for is not asked for again while it
        waits in the partition (a backlog can hold it longer than a tick)."""
        now = self.clock()
        due = [cmd for state in self.states.values() for cmd in overdue(state, now)]
        self.asked &= {cmd.command_id for cmd in due}
        new = [cmd for cmd in due if cmd.command_id not in self.asked]
        if new:
            log.info("turns_overdue", agents=len(new))
        self.asked |= {cmd.command_id for cmd in new}
        return [Out(COMMANDS.name, COMMANDS.key_bytes(cmd), encode(cmd)) for cmd in new]

    async def batch_done(self) -> list[Out]:
        if self.decided:
            log.info("ledger_batch", commands=self.decided, events=dict(self.kinds), rejected=dict(self.rejections))
            self.decided, self.kinds, self.rejections = 0, Counter(), Counter()
        return []
