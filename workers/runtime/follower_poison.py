"""The runner's rule for a message a follower cannot fold, for the folds that run inside the API
process: a message that breaks the contract is parked, and the follower goes on.

Parked means sent to the topic's DLQ with the runner's headers and `consumer_group` naming the
follower, so `memlane dlq list` shows it beside the workers' and an operator can replay it. A
replay names the group it is for: a follower skips the ones meant for another. Every API
replica folds every message, so each parks its own copy, and a fold read again from an older
position (a new replica, a lost checkpoint) parks it again."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from events.codec import Codec
from settings import Settings
from workers.runtime import metrics
from workers.runtime.dlq import replay_group
from workers.runtime.kafka_io import producer
from workers.runtime.parking import dead_letter

log = structlog.get_logger()
# A fold waits at most this long for a park: with the broker away, the message stays where it
# is, in its topic, and the fold goes on.
PARK_TIMEOUT_S = 5.0


class FollowerPoison:
    def __init__(self, settings: Settings, follower: str, codec: Codec) -> None:
        self.settings = settings
        self.group = f"{settings.group_prefix}.{settings.topic_prefix}{follower}"
        self.codec = codec  # seals a parked turn, as the runner's parks are
        self.parked = 0
        self._producer: Any = None

    def for_another(self, m: Any) -> bool:
        """Whether `m` is an operator's replay meant for another consumer group."""
        group = replay_group(getattr(m, "headers", None))
        return group is not None and group != self.group

    async def park(self, source: str, m: Any, error: str) -> None:
        """Sends `m` (of registry topic `source`) to its DLQ, naming `error`; never its text in a log."""
        out = dead_letter(source, m, error, 1, self.group, self.codec)
        try:
            sending = await asyncio.wait_for(self._started(), PARK_TIMEOUT_S)
            await asyncio.wait_for(sending.send_and_wait(self.settings.topic(out.topic), out.value, key=out.key,
                                                         headers=list(out.headers)), PARK_TIMEOUT_S)
        except Exception as e:
            log.warning("follower_park_failed", follower=self.group, topic=m.topic, partition=m.partition,
                        offset=m.offset, error=type(e).__name__)
            return
        self.parked += 1
        metrics.DLQ_MESSAGES.labels(out.topic).inc()
        log.warning("follower_parked_message", follower=self.group, topic=m.topic, partition=m.partition,
                    offset=m.offset, error=error[:300])

    async def _started(self) -> Any:
        """The producer, started on first use; one whose start failed is stopped and forgotten."""
        if self._producer is None:
            p = producer(self.settings)
            try:
                await p.start()
            except BaseException:
                await p.stop()
                raise
            self._producer = p
        return self._producer

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
