"""A poll's messages run concurrently across keys, for `concurrent_keys` processors: each key's
messages still start in offset order, and a processor may let a key's next message start
before the current one ends (`release_key`)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# Set while a message is handled: calling it lets the key's next message start.
_RELEASE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("release_key", default=None)


def release_key() -> None:
    """Called by a `concurrent_keys` processor once the order-sensitive part of a message is
    done: the key's next message may start while this one finishes (its outputs still go
    out in offset order). Only for work that gives the same result if the message is then
    retried after its successors started (idempotent, offset-indexed state)."""
    release = _RELEASE.get()
    if release is not None:
        release()


async def by_key(msgs: Sequence[Any], handle: Callable[[Any], Awaitable[list[T]]]) -> list[list[T]]:
    """`handle` of each message, keys at once; the results in the messages' order."""
    results: list[list[T]] = [[] for _ in msgs]
    keys: dict[tuple[str, int, bytes], list[int]] = {}
    for i, m in enumerate(msgs):
        keys.setdefault((m.topic, m.partition, m.key or b""), []).append(i)

    async def one(i: int, released: asyncio.Event) -> None:
        _RELEASE.set(released.set)  # the task's own context: no other message sees it
        try:
            results[i] = await handle(msgs[i])
        finally:
            released.set()

    async def one_key(idx: list[int]) -> None:
        # In key order: each message starts once the previous one released the key
        # (or finished); a key's messages then overlap on their slow, order-free part.
        tasks = []
        for i in idx:
            released = asyncio.Event()
            tasks.append(asyncio.create_task(one(i, released)))
            await released.wait()
        await asyncio.gather(*tasks)

    await asyncio.gather(*(one_key(idx) for idx in keys.values()))
    return results
