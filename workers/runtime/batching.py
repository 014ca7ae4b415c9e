"""Micro-batching: the calls concurrent tasks make in one event-loop turn go out as one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Collects items into batch calls of `send`.

    Why: a worker with hundreds of turns in flight pays a round trip (and the client's
    per-call CPU) per item otherwise. Items asked for in the same loop turn share a batch;
    while `max_in_flight` batches are out, items queue, so batches grow with load and an
    idle worker still sends at once.

    `send(items)` returns one result per item, an exception in an item's place failing
    that item alone; if `send` raises, every item of the batch fails with it.
    """

    def __init__(
        self,
        send: Callable[[list[T]], Awaitable[list[R | BaseException]]],
        max_items: int,
        max_in_flight: int = 2,
    ) -> None:
        self.send = send
        self.max_items = max_items
        self.max_in_flight = max_in_flight
        self.pending: list[tuple[T, asyncio.Future]] = []
        self.in_flight: set[asyncio.Task] = set()
        self.scheduled = False

    async def submit(self, item: T) -> R:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((item, fut))
        if not self.scheduled:
            # Flush on the next loop turn: what other tasks ask for in this turn joins.
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self.scheduled = False
        while self.pending and len(self.in_flight) < self.max_in_flight:
            batch, self.pending = self.pending[: self.max_items], self.pending[self.max_items :]
            task = asyncio.create_task(self._send(batch))
            self.in_flight.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        self._flush()

    async def _send(self, batch: list[tuple[T, asyncio.Future]]) -> None:
        results: list[Any]
        try:
            results = await self.send([item for item, _ in batch])
        except Exception as e:  # a transient failure fails each item; each caller retries
            results = [e] * len(batch)
        for (_, fut), res in zip(batch, results):
            if fut.done():  # its caller was cancelled
                continue
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)
