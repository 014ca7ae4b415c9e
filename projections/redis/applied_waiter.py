"""Read-your-writes: wait until the Redis record view has applied a version, without polling.

The view's writer publishes, with each batch it applies, what the batch changed: a JSON
object {"r": [[tenant/agent, record id, version], ...], "b": [[tenant/agent, label or null,
command id], ...]} on the deployment's channel (`RedisRecords.applied_channel`): record
versions, and the commands whose block change or subject change (consent, a removal) it
applied. A process that waits holds one subscription (`AppliedListener`) and wakes only the
waiters a message concerns; each then reads the view once to confirm (a message may come from
another generation). A command's own change is confirmed by its announcement, which the
listener remembers a while (`Waiters.RECENT`): a concurrent writer may have changed the value
since, so comparing values could wait for ever. `Waiters` is the pure part: who waits for
what, and whom a message wakes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from projections.redis import connection

log = structlog.get_logger()

Key = tuple[str, str, str]  # ("r", tenant/agent, record id) or ("b", tenant/agent, label)


def record_key(tenant: str, agent: str, rid: str) -> Key:
    return ("r", f"{tenant}/{agent}", rid)


def block_key(tenant: str, agent: str, label: str) -> Key:
    return ("b", f"{tenant}/{agent}", label)


def command_key(tenant: str, agent: str, command_id: str) -> Key:
    return ("c", f"{tenant}/{agent}", command_id)


def announcement(records: list[tuple[str, str, int]], changes: list[tuple[str, str | None, str]]) -> str:
    """The message for applied record versions (agent key, id, version) and applied block or
    subject changes (agent key, the block's label or None, command id), as the view's writer
    publishes it."""
    return json.dumps({"b": changes, "r": records}, separators=(",", ":"))


class Waiters:
    """Futures waiting for a record to reach a version, a block to change or a command's change
    to be applied; and the commands whose changes were announced lately."""

    RECENT = 4096  # remembered announced commands: far more than wait at once

    def __init__(self) -> None:
        self._waiting: dict[Key, list[tuple[int, asyncio.Future]]] = {}
        self._recent: dict[Key, None] = {}  # insertion-ordered: the oldest goes first

    def announced(self, key: Key) -> bool:
        """Whether the command's change (`command_key`) was announced lately."""
        return key in self._recent

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def watch(self, key: Key, version: int = 0) -> asyncio.Future:
        """A future resolved when `key` is announced at `version` or later (any change of a block)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((version, fut))
        return fut

    def forget(self, key: Key, fut: asyncio.Future) -> None:
        left = [w for w in self._waiting.get(key, ()) if w[1] is not fut]
        if left:
            self._waiting[key] = left
        else:
            self._waiting.pop(key, None)

    def applied(self, message: str | bytes) -> int:
        """Wake the waiters `message` concerns; returns how many. A malformed message wakes none."""
        raw = message if isinstance(message, bytes) else message.encode()
        if not self._waiting and b'"b":[]' in raw:
            return 0  # records only, and no one waits: not even parsed
        try:
            body = json.loads(raw)
            changes = [(("r", ak, rid), int(ver)) for ak, rid, ver in body.get("r", ())]
            for ak, label, command_id in body.get("b", ()):
                if label is not None:
                    changes.append((("b", ak, label), 0))
                key = ("c", ak, command_id)
                self._recent[key] = None
                changes.append((key, 0))
        except (ValueError, TypeError, AttributeError):
            log.warning("applied_message_malformed")
            return 0
        while len(self._recent) > self.RECENT:
            del self._recent[next(iter(self._recent))]
        woken = 0
        for key, ver in changes:
            for wanted, fut in self._waiting.get(key, ()):
                if ver >= wanted and not fut.done():
                    fut.set_result(True)
                    woken += 1
        return woken

    def wake_all(self) -> None:
        """Messages may have been lost (the subscription was down): everyone checks again."""
        for waiting in self._waiting.values():
            for _, fut in waiting:
                if not fut.done():
                    fut.set_result(True)


class AppliedListener:
    """One subscription to a view's announcements, shared by every waiter of a process."""

    RETRY_S = 0.5

    def __init__(self, client: Any, channel: str) -> None:
        self.r = client
        self.channel = channel
        self.waiters = Waiters()
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None

    async def start(self) -> None:
        """Subscribe, once, and return when the subscription is in place: a change applied
        after that is announced to this process."""
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._listen(), name="applied-listener")
        await asyncio.shield(self._ready)

    async def _subscribe(self) -> Any:
        pubsub = await connection.pubsub(self.r)
        await pubsub.subscribe(self.channel)
        # The confirmation, read before anyone relies on the subscription.
        while (m := await pubsub.get_message(timeout=5)) is None or m["type"] != "subscribe":
            pass
        return pubsub

    async def _listen(self) -> None:
        while True:
            pubsub = None
            try:
                pubsub = await self._subscribe()
                if not self._ready.done():
                    self._ready.set_result(None)
                self.waiters.wake_all()  # after a reconnect: what went by unheard is read again
                while True:
                    m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                    if m is not None and m["type"] == "message":
                        self.waiters.applied(m["data"])
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("applied_listener_reconnecting", error=type(e).__name__)
                self.waiters.wake_all()
                await asyncio.sleep(self.RETRY_S)
            finally:
                if pubsub is not None:
                    try:
                        await pubsub.aclose()
                    except Exception:
                        pass

    def announced(self, key: Key) -> bool:
        """Whether the view announced the command's change (`command_key`) lately."""
        return self.waiters.announced(key)

    async def wait(self, key: Key, shown: Callable[[], Awaitable[bool]], timeout: float, version: int = 0) -> bool:
        """Whether `shown()` holds within `timeout` seconds. It is checked once now (the change
        may be in already) and again each time the view announces `key` (at `version` or later)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(self.start(), timeout)
        except TimeoutError:
            # No subscription (Redis refused or unreachable): nothing to wait on, but the view
            # may show the change already.
            try:
                return await shown()
            except Exception:
                return False
        while True:
            fut = self.waiters.watch(key, version)  # before the check: nothing goes by unseen
            try:
                if await shown():
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(fut, left)
                except TimeoutError:
                    return await shown()  # one last look: the answer must not lag the view
            finally:
                self.waiters.forget(key, fut)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
