"""The API keys topic's adapter and follower, inside each API process (docs/features/api-keys.md).

`append` writes a key's record to `memlane.apikeys` (acks=all) before `services.auth.KeyStore`
writes Redis. `start` reads the topic to its end into `book` before the process serves, so the
book answers for a key Redis has lost; then a task restores the Redis view from the book and
follows the topic: it writes the revocations it reads (one whose writer failed between the log
and Redis), and restores the whole view whenever its mark is gone (Redis lost its data) or a
resolve met a working key Redis lacks.

Why it writes working keys only when restoring: the writer of a key put it in Redis already,
and a follower that wrote it again a moment after another process's revocation would show the
revoked key in its tenant's list until the follower read the revocation too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.api_keys import KeyBook, KeyRecord, key_id
from events.topics import API_KEYS
from projections.redis.api_key_view import ApiKeyView
from settings import Settings
from workers.runtime.kafka_io import ensure_log_topic, log_clients, stop_log_follower

log = structlog.get_logger()
CHECK_EVERY_S = 1.0  # how often the follower looks for the view's mark
RETRY_S = 1.0


class ApiKeyLog:
    def __init__(self, settings: Settings, view: ApiKeyView, check_every_s: float = CHECK_EVERY_S) -> None:
        self.settings = settings
        self.view = view
        self.check_every_s = check_every_s
        self.name = settings.topic(API_KEYS.name)
        self.tp = TopicPartition(self.name, 0)
        self.book = KeyBook()
        self.restores = 0  # full restores of the Redis view this process made
        self.restored = asyncio.Event()  # set after each one
        self.suspect = asyncio.Event()  # a resolve met a working key Redis lacks: check now
        self.stopping = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._producer: Any = None
        self._consumer: Any = None

    async def start(self, follow: bool = True) -> None:
        """Reads the topic to its end; then, with `follow`, restores the view and follows."""
        await ensure_log_topic(self.settings, API_KEYS)
        self._producer, self._consumer = await log_clients(self.settings, self.tp)
        await self.catch_up()
        log.info("api_keys_loaded", keys=len(self.book))
        if follow:
            self._task = asyncio.create_task(self._run(), name="api-keys-follower")
            self._task.add_done_callback(_report)

    async def stop(self) -> None:
        await stop_log_follower(self._task, self.stopping, self._producer, self._consumer)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def append(self, rec: KeyRecord) -> None:
        """`rec` on the log, acknowledged by every in-sync replica, and in this process's book."""
        value = rec.encode()
        sent = await self._producer.send_and_wait(self.name, value, key=rec.topic_key)
        self.book.apply(rec.topic_key, value, sent.offset)

    def get(self, digest: str) -> KeyRecord | None:
        return self.book.get(digest)

    async def _poll(self, timeout_ms: int) -> list[KeyRecord]:
        """The digests' records now, for what one poll read."""
        batch = await self._consumer.getmany(self.tp, timeout_ms=timeout_ms, max_records=5000)
        touched: dict[str, KeyRecord] = {}
        for m in batch.get(self.tp, ()):
            rec = self.book.apply(m.key, m.value, m.offset)
            if rec is not None:
                touched[rec.digest] = rec
        return list(touched.values())

    async def catch_up(self) -> None:
        """Reads the topic up to its end as of now."""
        end = (await self._consumer.end_offsets([self.tp]))[self.tp]
        while await self._consumer.position(self.tp) < end:
            await self._poll(200)

    async def adopt(self) -> int:
        """Publishes the keys Redis holds that the log does not (issued before keys went to the
        log), each under its adoption key, so a revocation always wins over it. How many."""
        n = 0
        async for digest, entry in self.view.unknown(lambda d: self.book.get(d) is not None):
            if entry.get("revoked"):
                continue
            entry = {"id": entry.get("id") or key_id(digest), "tenant": entry["tenant"], "agent": entry.get("agent"),
                     "role": entry["role"], "created": entry.get("created"),
                     **({"user": entry["user"]} if entry.get("user") is not None else {})}
            await self.append(KeyRecord(digest, entry, adopted=True))
            n += 1
        if n:
            log.info("api_keys_adopted", keys=n)
        return n

    async def restore(self) -> int:
        """The whole book written to the Redis view, and the view marked restored."""
        t0 = time.monotonic()
        n = await self.view.restore(lambda: list(self.book))
        self.restores += 1
        self.restored.set()
        log.info("api_keys_restored", keys=n, seconds=round(time.monotonic() - t0, 3))
        return n

    async def _run(self) -> None:
        # A start restores too: Redis may be new, or a copy from before a revocation.
        pending: dict[str, KeyRecord] = {}
        due = 0.0
        first = True
        while not self.stopping.is_set():
            try:
                if first or self.suspect.is_set() or time.monotonic() >= due:
                    self.suspect.clear()
                    due = time.monotonic() + self.check_every_s
                    intact = await self.view.restored()
                    if first or not intact:
                        if not intact:
                            await self.adopt()  # only a view never restored can hold keys the log lacks
                        await self.restore()
                        first = False
                for rec in await self._poll(200):
                    if rec.revoked is not None:
                        pending[rec.digest] = rec
                if pending:
                    await self.view.put_all(list(pending.values()))
                    pending.clear()
            except Exception as e:  # Redis or the broker away for a while: the book still answers
                log.warning("api_keys_follow_failed", error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(RETRY_S)


def _report(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("api_keys_follower_stopped", error=f"{type(task.exception()).__name__}: {task.exception()}")
