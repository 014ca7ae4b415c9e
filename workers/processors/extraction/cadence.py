"""Per-session cadence state of the extraction worker, in Redis.

Why Redis, and why this shape: the state must survive restarts and rebalances (a session's
unreviewed messages from earlier turns are part of the next window), and the worker's
Kafka transaction cannot include a Redis write. So the state is kept as immutable facts
indexed by the turn's source offset, never as a mutable counter:

- `t:<offset>`: the reviewable messages of the committed turn at that offset, sealed under
  the turn's subject (the member's key when the turn names one), so an erasure reaches them;
- `r:<offset>`: a review happened at that offset.

Reading at offset `o` only looks at facts below `o`, and writing at `o` is idempotent.
So a turn that is processed again after a crash (its Kafka transaction never committed,
but its Redis facts were written) sees exactly the state it saw the first time, and
decides the same thing. A rebuilt worker on another host reads the same facts.

Trimming keeps the newest review below `o - MAX_UNCOMMITTED` and everything after it: a
batch is at most `MAX_UNCOMMITTED` records, so any offset that may be processed again
still finds the review that precedes it.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from events.config import EveryMessages, ExtractionConfig
from events.sealing import Cipher, KeyDestroyed, KeyMissing, open_text, seal_text
from projections.redis.connection import is_cluster
from workers.runtime.batching import MicroBatcher

MAX_UNCOMMITTED = 500  # the runner's max records per partition batch (one transaction)
TTL_S = 30 * 24 * 3600


@dataclass(frozen=True)
class Due:
    due: bool
    pending: list[dict[str, str]]  # unreviewed messages, oldest first, this turn's last
    since: int  # messages since the last review, this turn's included


def decide_due(every: ExtractionConfig, since: int) -> bool:
    if isinstance(every.every, EveryMessages):
        return since >= every.every.messages
    return True


@dataclass
class SessionFacts:
    """One session's facts, their offsets kept sorted: a turn's decision reads a slice.

    Why sorted lists: scanning every fact for each turn cost ~5% of the worker's CPU on
    60-turn sessions, and a long session keeps up to ~1,000 facts (see trimming above).
    """

    turns: dict[int, list[dict[str, str]]] = field(default_factory=dict)
    turn_offsets: list[int] = field(default_factory=list)
    reviews: list[int] = field(default_factory=list)
    # Message id -> the lowest offset of a kept turn that holds it, and the ids more than
    # one turn holds: a platform may send a message again in a later turn (a retry, or the
    # whole conversation each time), and a message is shown to the reviews once.
    first_seen: dict[str, int] = field(default_factory=dict)
    repeated: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, raw: dict[Any, Any], key: str = "", cipher: Cipher | None = None) -> SessionFacts:
        """Raises `KeyMissing` for a turn sealed under a key not known yet; a turn sealed under
        a destroyed key (its member was erased) is left out."""
        facts = cls()
        for k, v in raw.items():
            f = k.decode() if isinstance(k, bytes) else k
            if f.startswith("t:"):
                try:
                    facts.add_turn(int(f[2:]), json.loads(_opened(v, f"{key}/{f}", cipher)))
                except KeyDestroyed:
                    continue
            else:
                facts.add_review(int(f[2:]))
        return facts

    def add_turn(self, offset: int, messages: list[dict[str, str]]) -> None:
        if offset in self.turns:
            return  # facts are immutable: a retried turn writes the same ones
        bisect.insort(self.turn_offsets, offset)
        self.turns[offset] = messages
        self._index(offset, messages)

    def _index(self, offset: int, messages: list[dict[str, str]]) -> None:
        for m in messages:
            seen = self.first_seen.get(m["id"])
            if seen is None:
                self.first_seen[m["id"]] = offset
            elif seen != offset:
                self.repeated.add(m["id"])
                if offset < seen:
                    self.first_seen[m["id"]] = offset

    def new_messages(self, offset: int, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """`messages` of the turn at `offset` that no earlier kept turn held, each id once.

        Only offsets below the turn's count, so a retried turn filters as it did the first time."""
        out: dict[str, dict[str, str]] = {}
        for m in messages:
            seen = self.first_seen.get(m["id"])
            if (seen is None or seen >= offset) and m["id"] not in out:
                out[m["id"]] = m
        return list(out.values()) if len(out) < len(messages) else messages

    def add_review(self, offset: int) -> None:
        i = bisect.bisect_left(self.reviews, offset)
        if i == len(self.reviews) or self.reviews[i] != offset:
            self.reviews.insert(i, offset)

    def last_review_below(self, offset: int) -> int | None:
        i = bisect.bisect_left(self.reviews, offset)
        return self.reviews[i - 1] if i else None

    def messages_between(self, after: int, before: int) -> list[dict[str, str]]:
        """Messages of the turns at offsets strictly between `after` and `before`, oldest first,
        each the first time a kept turn held it (a message already passed to a review, or
        already pending, is not shown again)."""
        lo, hi = bisect.bisect_right(self.turn_offsets, after), bisect.bisect_left(self.turn_offsets, before)
        return [m for o in self.turn_offsets[lo:hi] for m in self.new_messages(o, self.turns[o])]

    def drop_below(self, floor: int) -> list[str]:
        """Forget the facts at offsets below `floor`; their Redis fields."""
        t = bisect.bisect_left(self.turn_offsets, floor)
        r = bisect.bisect_left(self.reviews, floor)
        stale = [f"t:{o}" for o in self.turn_offsets[:t]] + [f"r:{o}" for o in self.reviews[:r]]
        reindex = False
        for o in self.turn_offsets[:t]:
            for m in self.turns.pop(o):
                if self.first_seen.get(m["id"]) == o:
                    del self.first_seen[m["id"]]
                    reindex = reindex or m["id"] in self.repeated
        del self.turn_offsets[:t], self.reviews[:r]
        if reindex:
            # A dropped turn held the first copy of a message a kept turn holds again: index
            # the kept turns afresh, as a cold start from Redis would (rare: only re-sent ids).
            self.first_seen.clear()
            self.repeated.clear()
            for o in self.turn_offsets:
                self._index(o, self.turns[o])
        return stale


Commands = list[tuple[str, tuple[Any, ...]]]  # (pipeline method name, arguments)


def pipelined(redis, transaction: bool) -> MicroBatcher[Commands, list[Any]]:
    """Concurrent reviews' Redis commands in one pipeline, each caller's results its own.

    Two round trips per turn cost more client CPU than the commands themselves. A
    `transaction` pipeline is one MULTI/EXEC, so each caller's commands stay atomic."""

    async def send(batch: list[Commands]) -> list[list[Any] | BaseException]:
        pipe = redis.pipeline(transaction=transaction)
        for commands in batch:
            for name, args in commands:
                getattr(pipe, name)(*args)
        results = await pipe.execute(raise_on_error=False)
        out: list[list[Any] | BaseException] = []
        at = 0
        for commands in batch:
            mine, at = results[at : at + len(commands)], at + len(commands)
            out.append(next((r for r in mine if isinstance(r, Exception)), mine))
        return out

    return MicroBatcher(send, max_items=500)


def _sealed(c: Cipher | None, subject: str, aad: str, text: str) -> str:
    return text if c is None else SEALED_PREFIX + seal_text(c, subject, aad, text)


def _opened(value: bytes | str, aad: str, c: Cipher | None) -> str:
    text = value.decode() if isinstance(value, bytes) else value
    if not text.startswith(SEALED_PREFIX):
        return text  # written before encryption, or with it off
    if c is None:
        raise KeyMissing("(no cipher in this process)")
    return open_text(c, aad, text[len(SEALED_PREFIX):])


SEALED_PREFIX = "s:"  # a sealed turn's value; a plaintext one is a JSON list


class ReviewState:
    """The facts, in Redis, and a copy of each session's facts in memory.

    Why the copy: the worker that owns a partition is the only one adding facts to its
    sessions, so after a first read it knows them without asking Redis again. Reading
    Redis for each turn, and waiting for the turn's write before the session's next turn
    could start, chained two round trips per turn within a session: in a backlog, ten
    turns of a session took two seconds under load. Now a turn's decision needs no round
    trip, and its write only has to land before the turn's Kafka transaction commits
    (`Observed.saved`), as before. The copy of a partition is dropped when the partition is
    revoked (`forget`); the next owner reads Redis. Facts are immutable and indexed by
    offset, so a retried turn, or a write landing after a later turn's, changes nothing.
    """

    def __init__(self, redis, namespace: str = "", max_sessions: int = 10_000, keys: Any = None,
                 cipher: Cipher | None = None) -> None:
        self.redis = redis
        self.cipher = cipher  # seals the turns' messages it keeps
        self.namespace = namespace
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: catch up on a key another worker made
        self.reads = pipelined(redis, transaction=False)
        # A batch's sessions span slots on a Redis Cluster, where no MULTI/EXEC may: there each
        # caller's commands (one session's key) go out in order, unwrapped.
        self.writes = pipelined(redis, transaction=not is_cluster(redis))
        self.max_sessions = max_sessions
        self.known: OrderedDict[str, SessionFacts] = OrderedDict()  # by Redis key
        self.unsaved: dict[str, set[asyncio.Future]] = {}  # writes of a key still on their way

    def key(self, partition: int, session_key: str) -> str:
        return f"{self.namespace}memlane:extraction:{partition}:{session_key}"

    def forget(self, partitions: set[int]) -> None:
        """Drop the copies of these partitions' sessions (revoked: another worker may add facts)."""
        heads = tuple(f"{self.namespace}memlane:extraction:{p}:" for p in partitions)
        for k in [k for k in self.known if k.startswith(heads)]:
            del self.known[k]

    async def _facts(self, key: str) -> SessionFacts:
        facts = self.known.get(key)
        if facts is not None:
            self.known.move_to_end(key)
            return facts
        # A copy dropped (revoked, evicted) while a turn's write was on its way: read after it.
        if self.unsaved.get(key):
            await asyncio.gather(*self.unsaved[key], return_exceptions=True)
        (raw,) = await self.reads.submit([("hgetall", (key,))])
        try:
            facts = SessionFacts.parse(raw, key, self.cipher)
        except KeyMissing:
            if self.keys is None:
                raise
            await self.keys.catch_up()
            facts = SessionFacts.parse(raw, key, self.cipher)
        # A session's turns run one after another (the runner orders them by key), so no
        # other read of this key raced this one.
        self.known[key] = facts
        while len(self.known) > self.max_sessions:
            self.known.popitem(last=False)
        return facts

    async def observe(
        self, partition: int, session_key: str, offset: int, messages: list[dict[str, str]], cfg: ExtractionConfig,
        subject: str = "",
    ) -> Observed:
        """`subject` (events.sealing.subject_of) seals the turn's messages in Redis."""
        key = self.key(partition, session_key)
        facts = await self._facts(key)
        last = facts.last_review_below(offset)
        pending = facts.messages_between(-1 if last is None else last, offset) + facts.new_messages(offset, messages)
        since = len(pending)
        due = decide_due(cfg, since)
        floor = facts.last_review_below(offset - MAX_UNCOMMITTED)
        facts.add_turn(offset, messages)
        sealed = _sealed(self.cipher, subject, f"{key}/t:{offset}", json.dumps(messages))
        if self.keys is not None:
            await self.keys.flush()  # a key made for this turn goes before what it sealed
        writes: Commands = [("hset", (key, f"t:{offset}", sealed))]
        if due:
            facts.add_review(offset)
            writes.append(("hset", (key, f"r:{offset}", "1")))
        if floor is not None:
            stale = facts.drop_below(floor)
            if stale:
                writes.append(("hdel", (key, *stale)))
        writes.append(("expire", (key, TTL_S)))
        saved = asyncio.ensure_future(self.writes.submit(writes))
        self.unsaved.setdefault(key, set()).add(saved)
        saved.add_done_callback(lambda f: self._landed(key, f))
        return Observed(Due(due, pending, since), saved)

    def _landed(self, key: str, f: asyncio.Future) -> None:
        left = self.unsaved.get(key)
        if left is not None:
            left.discard(f)
            if not left:
                del self.unsaved[key]


@dataclass(frozen=True)
class Observed:
    due: Due
    saved: asyncio.Future  # the turn's facts written to Redis; await it before committing
