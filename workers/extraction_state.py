"""Per-session cadence state of the extraction worker, in Redis.

Why Redis, and why this shape: the state must survive restarts and rebalances (a session's
unreviewed messages from earlier turns are part of the next window), and the worker's
Kafka transaction cannot include a Redis write. So the state is kept as immutable facts
indexed by the turn's source offset, never as a mutable counter:

- `t:<offset>`: the reviewable messages of the committed turn at that offset;
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

import json
from dataclasses import dataclass
from typing import Any

from events.config import EveryMessages, ExtractionConfig
from workers.batching import MicroBatcher

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


def _off(field: str) -> int:
    return int(field[2:])


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


class ReviewState:
    def __init__(self, redis, namespace: str = "") -> None:
        self.redis = redis
        self.namespace = namespace
        self.reads = pipelined(redis, transaction=False)
        self.writes = pipelined(redis, transaction=True)

    def key(self, partition: int, session_key: str) -> str:
        return f"{self.namespace}memlane:extraction:{partition}:{session_key}"

    async def observe(
        self, partition: int, session_key: str, offset: int, messages: list[dict[str, str]], cfg: ExtractionConfig
    ) -> Due:
        key = self.key(partition, session_key)
        (raw,) = await self.reads.submit([("hgetall", (key,))])
        fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
        reviews = sorted(_off(f) for f in fields if f.startswith("r:"))
        last = max((r for r in reviews if r < offset), default=-1)
        earlier = sorted(_off(f) for f in fields if f.startswith("t:") and last < _off(f) < offset)
        pending: list[dict[str, str]] = []
        for o in earlier:
            pending.extend(json.loads(fields[f"t:{o}"]))
        pending.extend(messages)
        since = len(pending)
        due = decide_due(cfg, since)
        writes: Commands = [("hset", (key, f"t:{offset}", json.dumps(messages)))]
        if due:
            writes.append(("hset", (key, f"r:{offset}", "1")))
        floor = max((r for r in reviews if r < offset - MAX_UNCOMMITTED), default=None)
        if floor is not None:
            stale = [f for f in fields if _off(f) < floor]
            if stale:
                writes.append(("hdel", (key, *stale)))
        writes.append(("expire", (key, TTL_S)))
        await self.writes.submit(writes)
        return Due(due, pending, since)
