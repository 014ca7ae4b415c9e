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

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from events.config import EveryMessages, ExtractionConfig

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


class PipelineBatcher:
    """Sends the Redis commands that concurrent reviews ask for in one pipeline.

    Why: a worker with hundreds of turns in flight read and wrote each session's state in
    two round trips per turn, and the client's per-call overhead cost more CPU than the
    commands. Calls made in the same event-loop turn share a pipeline; while `max_in_flight`
    pipelines are out, calls queue, so pipelines grow with load and an idle worker still
    sends at once. Each caller gets its own commands' results (or its own error); a
    `transaction` pipeline is one MULTI/EXEC, so each caller's commands stay atomic.
    """

    def __init__(self, redis, transaction: bool, max_in_flight: int = 2, max_calls: int = 500) -> None:
        self.redis = redis
        self.transaction = transaction
        self.max_in_flight = max_in_flight
        self.max_calls = max_calls
        self.pending: list[tuple[list[tuple[str, tuple[Any, ...]]], asyncio.Future]] = []
        self.in_flight: set[asyncio.Task] = set()
        self.scheduled = False

    async def run(self, commands: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """`commands`: (pipeline method name, arguments) pairs; returns their results."""
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((commands, fut))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self.scheduled = False
        while self.pending and len(self.in_flight) < self.max_in_flight:
            batch, self.pending = self.pending[: self.max_calls], self.pending[self.max_calls :]
            task = asyncio.create_task(self._send(batch))
            self.in_flight.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        self._flush()

    async def _send(self, batch: list[tuple[list[tuple[str, tuple[Any, ...]]], asyncio.Future]]) -> None:
        try:
            pipe = self.redis.pipeline(transaction=self.transaction)
            for commands, _ in batch:
                for name, args in commands:
                    getattr(pipe, name)(*args)
            results = await pipe.execute(raise_on_error=False)
        except Exception as e:  # the whole pipeline failed (Redis unreachable): every caller retries
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        at = 0
        for commands, fut in batch:
            mine, at = results[at : at + len(commands)], at + len(commands)
            if fut.done():  # its turn was cancelled
                continue
            err = next((r for r in mine if isinstance(r, Exception)), None)
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(mine)


class ReviewState:
    def __init__(self, redis, namespace: str = "") -> None:
        self.redis = redis
        self.namespace = namespace
        self.reads = PipelineBatcher(redis, transaction=False)
        self.writes = PipelineBatcher(redis, transaction=True)

    def key(self, partition: int, session_key: str) -> str:
        return f"{self.namespace}memlane:extraction:{partition}:{session_key}"

    async def observe(
        self, partition: int, session_key: str, offset: int, messages: list[dict[str, str]], cfg: ExtractionConfig
    ) -> Due:
        key = self.key(partition, session_key)
        (raw,) = await self.reads.run([("hgetall", (key,))])
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
        writes: list[tuple[str, tuple[Any, ...]]] = [("hset", (key, f"t:{offset}", json.dumps(messages)))]
        if due:
            writes.append(("hset", (key, f"r:{offset}", "1")))
        floor = max((r for r in reviews if r < offset - MAX_UNCOMMITTED), default=None)
        if floor is not None:
            stale = [f for f in fields if _off(f) < floor]
            if stale:
                writes.append(("hdel", (key, *stale)))
        writes.append(("expire", (key, TTL_S)))
        await self.writes.run(writes)
        return Due(due, pending, since)
