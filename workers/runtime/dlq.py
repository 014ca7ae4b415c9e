"""Dead letters for operators: read `<topic>.dlq`, and send chosen ones back to their source
topic (`memlane dlq list|show|replay`).

A replay is the same key and the same value bytes (a turn memlane parked sealed is opened
first: the platform wrote it in plaintext) with replay headers:

- `memlane-replay-of`: `<dlq topic>@<partition>:<offset>`, the dead letter it came from;
- `memlane-replay-count`: how many times this message has been replayed (1 the first time);
- `memlane-replay-for`: the consumer group that parked it. Only that group processes the
  replay; every other runner of the source topic skips it (it handled the original once);
- `memlane-replay-origin`: `<topic>/<partition>/<offset>` of the first time the message was
  on its source topic, so a worker whose state is indexed by source offset (the extraction
  worker's review cadence) decides as it would have the first time.

A replay that fails again is parked again with these headers kept (workers.runtime.runner), so the
operator sees it is a repeat. Nothing replays on its own: only the command sends. Which dead
letters were replayed is kept in Redis (`<root>dlq:replayed:<dlq topic>`, field
`<partition>:<offset>`), claimed before the send, so a second `replay --all` sends nothing
again, and two operators replaying at once never send one twice.

The memory events' log is the source of truth, written by the ledger alone: a dead letter of
it is never replayed into it (its original stays in the log at the source offset; fix the
consumer and `memlane rebuild`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, KafkaTimeoutError

from events.codec import Codec, ContractError
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS, TOPICS
from settings import Settings
from workers.runtime.kafka_io import producer, reader

REPLAY_OF = "memlane-replay-of"
REPLAY_COUNT = "memlane-replay-count"
REPLAY_FOR = "memlane-replay-for"
REPLAY_ORIGIN = "memlane-replay-origin"
REPLAY_HEADERS = (REPLAY_OF, REPLAY_COUNT, REPLAY_FOR, REPLAY_ORIGIN)
# What a listing shows of a dead letter: its place and why it is there, never its value.
SHOWN = ("source_topic", "source_partition", "source_offset", "error", "attempt", "consumer_group", "value_dropped",
         *REPLAY_HEADERS)
NOT_REPLAYABLE = {EVENTS.dlq: "the memory events' log is the source of truth, written by the ledger alone: its "
                  "original is still in the log at the source offset; fix the consumer, then `memlane rebuild`"}


def replay_group(headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    """The consumer group a replayed message is for (None: not a replay, for every group)."""
    for k, v in headers or ():
        if k == REPLAY_FOR:
            return v.decode(errors="replace")
    return None


def replay_origin(headers: Iterable[tuple[str, bytes]] | None) -> tuple[int, int] | None:
    """(partition, offset) of a replayed message's first place on its source topic."""
    for k, v in headers or ():
        if k == REPLAY_ORIGIN:
            try:
                _, partition, offset = v.decode(errors="replace").rsplit("/", 2)
                return int(partition), int(offset)
            except ValueError:
                return None
    return None


def kept_on_repeat(headers: Iterable[tuple[str, bytes]] | None) -> tuple[tuple[str, bytes], ...]:
    """The replay headers of a message that is parked again: they stay on its new dead letter."""
    return tuple((k, v) for k, v in headers or () if k in REPLAY_HEADERS)


def dlq_name(spec: str, settings: Settings) -> str:
    """The registry name of a dead-letter topic from what an operator types: `memlane.turns`,
    `memlane.turns.dlq`, or either with the deployment's topic prefix."""
    name = spec.removeprefix(settings.topic_prefix) if settings.topic_prefix else spec
    name = name.removesuffix(".dlq")
    if name not in TOPICS:
        known = ", ".join(t.dlq for t in TOPICS.values())
        raise ValueError(f"no dead-letter topic {spec!r}; one of {known}")
    return TOPICS[name].dlq


def replayed_key(settings: Settings, dlq: str) -> str:
    return f"{settings.redis_root}dlq:replayed:{dlq}"


@dataclass
class Letter:
    """One dead letter as an operator sees it. `value` is read only when asked for."""

    partition: int
    offset: int
    timestamp: str
    key: str
    headers: dict[str, str]
    size: int
    raw_key: bytes | None = field(default=None, repr=False)
    replayed: dict[str, Any] | None = None  # when, where to, by which replay count
    value: bytes | None = field(default=None, repr=False)

    @property
    def ref(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def repeat(self) -> int:
        """How many times the message had been replayed before it was parked this time."""
        try:
            return int(self.headers.get(REPLAY_COUNT, "0"))
        except ValueError:
            return 0

    def view(self, value: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"partition": self.partition, "offset": self.offset, "timestamp": self.timestamp,
                               "key": self.key, "size": self.size, "repeat": self.repeat,
                               "replayed": self.replayed,
                               "headers": {k: v for k, v in self.headers.items() if k in SHOWN}}
        if value:
            out["value"] = None if self.value is None else self.value.decode(errors="replace")
        return out


def _letter(m: Any, keep_value: bool) -> Letter:
    return Letter(
        partition=m.partition,
        offset=m.offset,
        timestamp=datetime.fromtimestamp(m.timestamp / 1000, UTC).isoformat(),
        key=(m.key or b"").decode(errors="replace"),
        headers={k: v.decode(errors="replace") for k, v in (m.headers or ())},
        size=len(m.value or b""),
        raw_key=m.key,
        value=m.value if keep_value else None,
    )


class DeadLetters:
    """Reads and replays one deployment's dead letters (Kafka, Redis for the replay record)."""

    def __init__(self, settings: Settings, redis: Any, codec: Codec) -> None:
        self.settings = settings
        self.r = redis
        self.codec = codec  # opens parked turns before they go back

    async def partitions(self, dlq: str) -> list[TopicPartition]:
        """The dead-letter topic's partitions (ensure_topics makes one; an operator may have made more)."""
        name = self.settings.topic(dlq)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap, request_timeout_ms=10_000)
        await admin.start()
        try:
            # Listed first: describing a topic that does not exist would make the broker create it.
            if name not in await admin.list_topics():
                return []
            [d] = await admin.describe_topics([name])
        finally:
            await admin.close()
        if d["error_code"]:
            return []
        return [TopicPartition(name, p["partition"]) for p in sorted(d["partitions"], key=lambda p: p["partition"])]

    async def sizes(self, dlqs: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Per dead-letter topic: messages on it (end minus beginning: an upper bound) and replayed."""
        out: dict[str, dict[str, Any]] = {}
        c = reader(self.settings)
        try:
            await c.start()
            for dlq in dlqs:
                tps = await self.partitions(dlq)
                if not tps:
                    out[dlq] = {"topic": self.settings.topic(dlq), "size": None, "replayed": 0}
                    continue
                begin, end = await c.beginning_offsets(tps), await c.end_offsets(tps)
                out[dlq] = {"topic": self.settings.topic(dlq), "size": sum(end[tp] - begin[tp] for tp in tps),
                            "replayed": await self.r.hlen(replayed_key(self.settings, dlq))}
        finally:
            await c.stop()
        return out

    async def letters(self, dlq: str, keep_value: bool = False) -> list[Letter]:
        """Every dead letter of the topic, oldest first per partition, with what was replayed."""
        tps = await self.partitions(dlq)
        if not tps:
            return []
        c = reader(self.settings, max_poll_records=5000)
        await c.start()
        try:
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            end = await c.end_offsets(tps)
            got: list[Letter] = []
            while [tp for tp in tps if await c.position(tp) < end[tp]]:
                for msgs in (await c.getmany(*tps, timeout_ms=500)).values():
                    got += [_letter(m, keep_value) for m in msgs]
        finally:
            await c.stop()
        await self._mark(dlq, got)
        return got

    async def letter(self, dlq: str, partition: int, offset: int, keep_value: bool = False) -> Letter | None:
        tp = TopicPartition(self.settings.topic(dlq), partition)
        if tp not in await self.partitions(dlq):
            return None
        c = reader(self.settings, max_poll_records=1)
        await c.start()
        try:
            c.assign([tp])
            begin, end = (await c.beginning_offsets([tp]))[tp], (await c.end_offsets([tp]))[tp]
            if not begin <= offset < end:
                return None
            c.seek(tp, offset)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and await c.position(tp) < end:
                for m in (await c.getmany(tp, timeout_ms=500)).get(tp, []):
                    if m.offset == offset:
                        found = _letter(m, keep_value)
                        await self._mark(dlq, [found])
                        return found
                    if m.offset > offset:
                        return None  # a transaction marker's offset: no message there
            return None
        finally:
            await c.stop()

    async def _mark(self, dlq: str, letters: list[Letter]) -> None:
        if not letters:
            return
        raw = await self.r.hmget(replayed_key(self.settings, dlq), [x.ref for x in letters])
        for x, v in zip(letters, raw):
            x.replayed = json.loads(v) if v else None

    def replayable(self, dlq: str) -> str | None:
        """Why the topic's dead letters may not be replayed, or None."""
        return NOT_REPLAYABLE.get(dlq)

    async def replay(self, dlq: str, letters: list[Letter], progress: Callable[[int, int], None] | None = None,
                     ) -> list[dict[str, Any]]:
        """Sends each letter not replayed yet back to its source topic; returns what was sent
        (ref, the new place) and what was skipped (ref, why). Letters need their values."""
        results: list[dict[str, Any]] = []
        p = producer(self.settings)
        await p.start()
        try:
            for i, x in enumerate(letters):
                results.append(await self._one(p, dlq, x))
                if progress:
                    progress(i + 1, len(letters))
        finally:
            await p.stop()
        return results

    async def _one(self, p: Any, dlq: str, x: Letter) -> dict[str, Any]:
        s, h = self.settings, x.headers
        source = h.get("source_topic")
        if not source or source.removeprefix(s.topic_prefix) + ".dlq" != dlq:
            return {"ref": x.ref, "skipped": f"its source_topic header ({source!r}) is not this topic's source"}
        if "value_dropped" in h or x.value is None:
            return {"ref": x.ref, "skipped": "its value was too large to park; the original is at "
                    f"{source}/{h.get('source_partition')}/{h.get('source_offset')} for its retention"}
        if not (h.get("source_partition") or "").isdigit():
            return {"ref": x.ref, "skipped": "its source_partition header is missing; a replay goes back to the "
                    "partition it came from, beside the rest of its session or agent"}
        where = f"{source}/{h.get('source_partition')}/{h.get('source_offset')}"
        try:
            value = self.codec.unpark(x.value, where)  # the platform's plaintext, as it was sent
        except (KeyDestroyed, KeyMissing, ContractError) as e:
            return {"ref": x.ref, "skipped": f"cannot open it ({type(e).__name__}: its subject was erased, or this "
                    "process has no data keys)"}
        count = x.repeat + 1
        claim = json.dumps({"at": datetime.now(UTC).isoformat(), "count": count})
        key = replayed_key(s, dlq)
        if not await self.r.hsetnx(key, x.ref, claim):
            return {"ref": x.ref, "skipped": "replayed already"}
        headers = [
            (REPLAY_OF, f"{s.topic(dlq)}@{x.ref}".encode()),
            (REPLAY_COUNT, str(count).encode()),
            (REPLAY_ORIGIN, (h.get(REPLAY_ORIGIN) or where).encode()),
        ]
        if h.get("consumer_group"):
            headers.append((REPLAY_FOR, h["consumer_group"].encode()))
        try:
            meta = await p.send_and_wait(source, value, key=x.raw_key, headers=headers,
                                         partition=int(h["source_partition"]))
        except KafkaError as e:
            # Refused by the broker: not written, so it may be replayed again. A timeout (or an
            # interruption, below) may have been written: the claim stays, so no later replay
            # sends it twice, and `dlq list` shows it as sending, for the operator to check.
            if not isinstance(e, KafkaTimeoutError):
                await self.r.hdel(key, x.ref)
            raise
        to = f"{meta.topic}/{meta.partition}/{meta.offset}"
        await self.r.hset(key, x.ref, json.dumps({**json.loads(claim), "to": to}))
        return {"ref": x.ref, "sent": to, "count": count}
