"""The web sessions topic's adapter and follower, inside each API process: `append` writes a
session's record (or a sign-out's tombstone) to `memlane.websessions` (acks=all) before
`services.http.sessions.WebSessions` writes Redis; `start` reads the topic to its end before the
process serves, and a task follows it, so any process's book answers for a session Redis has
lost (the sessions then go back to Redis as they are asked for)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.topics import WEB_SESSIONS
from events.web_sessions import SessionBook, SessionRecord
from settings import Settings
from workers.runtime.kafka_io import ensure_log_topic, log_clients, stop_log_follower

log = structlog.get_logger()
RETRY_S = 1.0


class WebSessionLog:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.topic(WEB_SESSIONS.name)
        self.tp = TopicPartition(self.name, 0)
        self.book = SessionBook()
        self.stopping = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._producer: Any = None
        self._consumer: Any = None

    async def start(self) -> None:
        await ensure_log_topic(self.settings, WEB_SESSIONS)
        self._producer, self._consumer = await log_clients(self.settings, self.tp)
        end = (await self._consumer.end_offsets([self.tp]))[self.tp]
        while await self._consumer.position(self.tp) < end:
            await self._poll(200)
        log.info("web_sessions_loaded", sessions=len(self.book))
        self._task = asyncio.create_task(self._follow(), name="web-sessions-follower")

    async def stop(self) -> None:
        await stop_log_follower(self._task, self.stopping, self._producer, self._consumer)

    async def append(self, name: str, rec: SessionRecord | None) -> None:
        """The session's record (None: it ended) on the log, acknowledged, and in this book."""
        value = None if rec is None else rec.encode()
        sent = await self._producer.send_and_wait(self.name, value, key=name.encode())
        self.book.apply(name, value, sent.offset)

    def get(self, name: str) -> SessionRecord | None:
        return self.book.get(name)

    async def _poll(self, timeout_ms: int) -> None:
        batch = await self._consumer.getmany(self.tp, timeout_ms=timeout_ms, max_records=5000)
        for m in batch.get(self.tp, ()):
            self.book.apply(m.key.decode(), m.value, m.offset)

    async def _follow(self) -> None:
        while not self.stopping.is_set():
            try:
                await self._poll(200)
            except Exception as e:  # the broker away for a while: the book still answers
                log.warning("web_sessions_follow_failed", error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(RETRY_S)
