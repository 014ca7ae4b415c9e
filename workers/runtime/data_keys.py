"""The keys topic's adapter: every process loads `memlane.keys` at start, follows it (new
keys, destroyed ones), and publishes the keys it makes before anything sealed under them."""

from __future__ import annotations

import asyncio
from datetime import datetime

import structlog
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAlreadyExistsError

from events.codec import Codec
from events.sealing import KeyDestroyed, KeyMissing, agent_subject
from events.topics import keys_topic
from projections.keys import Keyring
from settings import Settings
from workers.runtime.kafka_io import log_clients, new_topic

log = structlog.get_logger()
ROLL_KEY = b"~roll"  # not a key: see `KeyTopic._roll_segment`


class KeyTopic:
    def __init__(self, settings: Settings, keyring: Keyring) -> None:
        self.settings = settings
        self.keyring = keyring
        self.topic = keys_topic(settings.keys_segment_ms)
        self.name = settings.topic(self.topic.name)
        self.tp = TopicPartition(self.name, 0)
        self._lock = asyncio.Lock()
        self._flushing = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._roll: asyncio.Task | None = None
        self._shared: tuple[tuple, _Shared] | None = None  # set when `open_keys` shares it

    async def start(self, follow: bool = True) -> None:
        await self._ensure_topic()
        self.producer, self.consumer = await log_clients(self.settings, self.tp)
        await self.catch_up()
        if follow:
            self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        """Stops following and publishing; for keys shared in this process (`open_keys`), only
        once the last of their users stops."""
        if self._shared is not None:
            ident, shared = self._shared
            shared.users -= 1
            if shared.users > 0:
                await self.flush()
                return
            if _OPEN.get(ident) is shared:
                del _OPEN[ident]
        for task in (self._task, self._roll):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.flush()
        await self.consumer.stop()
        await self.producer.stop()

    async def _ensure_topic(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        await admin.start()
        try:
            if self.name not in set(await admin.list_topics()):
                try:
                    await admin.create_topics([new_topic(self.settings, self.name, 1, self.topic.config)])
                except TopicAlreadyExistsError:
                    pass
        finally:
            await admin.close()

    async def _poll(self, timeout_ms: int) -> None:
        batches = await self.consumer.getmany(self.tp, timeout_ms=timeout_ms, max_records=5000)
        failed: Exception | None = None
        for m in batches.get(self.tp, ()):
            if m.key != ROLL_KEY:
                # One key that does not unwrap must not cost the rest of the batch (tombstones
                # among them): the consumer has moved past all of it.
                try:
                    self.keyring.apply(m.key, m.value)
                except Exception as e:
                    log.error("key_not_applied", key=m.key.decode(errors="replace"), offset=m.offset,
                              error=type(e).__name__)
                    failed = failed or e
        if failed is not None:
            raise failed

    async def catch_up(self) -> None:
        """Reads the topic up to its end as of now: every key published before this call is known after it."""
        end = (await self.consumer.end_offsets([self.tp]))[self.tp]
        async with self._lock:
            while await self.consumer.position(self.tp) < end:
                await self._poll(200)

    async def _follow(self) -> None:
        while True:
            try:
                async with self._lock:
                    await self._poll(500)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the broker away for a while: keep the keys we have
                log.warning("keys_follow_failed", error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(1)
            await asyncio.sleep(0.05)

    async def flush(self) -> None:
        """Publishes the keys this process made: called before anything sealed under them is
        written, so no reader ever meets a key that was lost with a crash."""
        async with self._flushing:  # a runner's commit and its processor's own write may flush at once
            while self.keyring.pending:
                rec = self.keyring.pending[0]
                await self.producer.send_and_wait(self.name, rec.encode(), key=rec.topic_key)
                # By identity: a destroy during the send replaces the list (`Keyring._forget`).
                if rec in self.keyring.pending:
                    self.keyring.pending.remove(rec)

    async def destroy(self, subject: str, before: datetime | None = None) -> int:
        """Tombstones `subject`'s keys (an agent's subject takes its members' keys along),
        those made before `before` when it is given. Returns how many."""
        doomed = [r for s in self.keyring.subjects() if s == subject or (agent_subject(s) == subject and s != subject)
                  for r in self.keyring.kids(s) if before is None or r.created <= before]
        for r in doomed:
            await self.producer.send_and_wait(self.name, None, key=r.topic_key)
            self.keyring.apply(r.topic_key, None)
        if doomed:
            log.info("keys_destroyed", keys=len(doomed))
            if self._roll is None or self._roll.done():
                self._roll = asyncio.create_task(self._roll_segment())
        return len(doomed)

    async def _roll_segment(self) -> None:
        """Kafka rolls a segment only on an append after `segment.ms`, and never compacts the
        open one: with no key made after an erasure, the destroyed keys' bytes would stay. One
        marker appended once `segment.ms` has passed closes their segment for the cleaner."""
        await asyncio.sleep(self.settings.keys_segment_ms / 1000 + 1)
        await self.producer.send_and_wait(self.name, b"{}", key=ROLL_KEY)

    async def destroy_tenant(self, tenant: str) -> int:
        n = 0
        for s in {agent_subject(s) for s in self.keyring.subjects() if s.split("/", 1)[0] == tenant}:
            n += await self.destroy(s)
        return n

    async def rewrap(self, progress=None) -> int:
        """Every data key wrapped again under the provider's current KEK (key rotation); the
        log's ciphertexts stay as they are."""
        recs = [r for r in self.keyring.records() if r.kek != self.keyring.provider.current]
        for i, r in enumerate(recs):
            new = self.keyring.rewrapped(r)
            await self.producer.send_and_wait(self.name, new.encode(), key=new.topic_key)
            self.keyring.apply(new.topic_key, new.encode())
            if progress:
                progress(i + 1, len(recs))
        # A key destroyed after this process caught up was just published again under its own
        # message key: compaction would keep the rewrap and drop the tombstone, and a process
        # started later would know the key again. Tombstoned once more.
        await self.catch_up()
        for r in recs:
            if r.kid in self.keyring.destroyed:
                await self.producer.send_and_wait(self.name, None, key=r.topic_key)
                log.info("key_destroyed_again", kid=r.kid)
        return len(recs)

    async def opening(self, fn, *args):
        """`fn(*args)`, caught up on the keys once if it meets a key not known yet. A key still
        unknown then was destroyed: `KeyDestroyed` is raised."""
        try:
            return fn(*args)
        except KeyMissing:
            await self.catch_up()
        try:
            return fn(*args)
        except KeyMissing as e:
            raise KeyDestroyed(e.kid) from None


# Followed keys open in this process, by event loop, keyring, topic and broker: shared by every
# runner given the same codec, so a key one of them catches up on is known to all at once.
_OPEN: dict[tuple[int, int, str, str], _Shared] = {}


class _Shared:
    def __init__(self, started: asyncio.Future) -> None:
        self.started = started
        self.users = 0


async def _started(settings: Settings, keyring: Keyring) -> KeyTopic:
    keys = KeyTopic(settings, keyring)
    await keys.start(follow=True)
    return keys


async def open_keys(settings: Settings, codec: Codec, follow: bool = True) -> KeyTopic | None:
    """The keys of `codec`'s keyring (built by the composition root): loaded from the keys topic,
    and followed. None for a codec without one (encryption off). Followed keys are opened once
    per keyring (and event loop) and shared: each caller stops its own handle, and the last stop
    closes them. `follow=False` loads them once and follows nothing."""
    keyring = codec.cipher
    if keyring is None:
        return None
    if not isinstance(keyring, Keyring):
        raise TypeError(f"data keys: the codec's cipher is a {type(keyring).__name__}, not a Keyring")
    if not follow:
        keys = KeyTopic(settings, keyring)
        await keys.start(follow=False)
        return keys
    ident = (id(asyncio.get_running_loop()), id(keyring), settings.topic(keys_topic(settings.keys_segment_ms).name),
             settings.kafka_bootstrap)
    shared = _OPEN.get(ident)
    if shared is None:
        shared = _OPEN[ident] = _Shared(asyncio.ensure_future(_started(settings, keyring)))
    shared.users += 1
    try:
        keys = await asyncio.shield(shared.started)
    except BaseException:
        shared.users -= 1
        if shared.users == 0 and _OPEN.get(ident) is shared:
            del _OPEN[ident]
        raise
    keys._shared = (ident, shared)
    return keys


async def install_keys(settings: Settings, codec: Codec) -> None:
    """Loads the data keys into `codec`'s keyring, for a command that opens sealed events and
    makes no key of its own: the keys topic is read once, not followed."""
    keys = await open_keys(settings, codec, follow=False)
    if keys is not None:
        await keys.stop()
