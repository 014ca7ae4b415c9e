"""The ledger's idempotency window: the commands it decided recently, per partition, who gave
them (the `CALLER` header on their events) and, for an older one whose events it no longer
holds, those events read back from the log (`logged`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from aiokafka import TopicPartition

from events.rules.ledger import command_key
from events.topics import EVENTS, REDELIVERED
from workers.runtime.kafka_io import reader

if TYPE_CHECKING:
    from settings import Settings

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


class Envelope(msgspec.Struct):
    """What names an event's command, never sealed: read of an event that no longer opens."""

    tenant: str
    agent: str
    command_id: str


ENVELOPE = msgspec.json.Decoder(Envelope)


def caller_of(headers: Any) -> str | None:
    """The caller an event of the log names (`CALLER`), if it names one."""
    for name, value in headers or ():
        if name == CALLER:
            return value.decode()
    return None


async def logged(settings: Settings, partition: int, ck: str, at_ms: int) -> list[bytes]:
    """An older command's events, read back from the log: from the first message stamped a
    second before its decision, on until a minute past it (its events commit in one
    transaction, with that batch's other commands)."""
    c = reader(settings, max_poll_records=500)
    await c.start()
    try:
        tp = TopicPartition(settings.topic(EVENTS.name), partition)
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
                    e = ENVELOPE.decode(m.value)
                except msgspec.MsgspecError:  # not an event the ledger wrote
                    continue
                if command_key(e.tenant, e.agent, e.command_id) == ck:
                    raws.append(m.value)
        return raws
    finally:
        await c.stop()
