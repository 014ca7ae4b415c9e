"""`memlane webhooks deliver`: the webhook delivery worker (`workers.followers.webhook_delivery`).
Run one or more: they share the events topic's partitions in a consumer group."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from settings import get_settings


def add_parsers(sub: Any) -> None:
    w = sub.add_parser("webhooks", help="deliver the tenants' webhooks (memory.changed, subject.erased)")
    w.add_argument("action", choices=["deliver"])
    w.set_defaults(fn=cmd_webhooks)


def cmd_webhooks(args: argparse.Namespace) -> int:
    import uvloop

    from events.topics import WEBHOOKS, WEBHOOKS_DEAD
    from services.bootstrap import keys_at
    from settings.logging import configure
    from workers.followers.webhook_delivery import WebhookDelivery
    from workers.runtime.data_keys import open_keys
    from workers.runtime.kafka_io import ensure_topics, wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="worker.webhooks")

    async def run() -> None:
        await wait_for_broker(settings)
        await ensure_topics(settings, [WEBHOOKS, WEBHOOKS_DEAD])
        codec = keys_at(settings)()
        keys = await open_keys(settings, codec)
        worker = WebhookDelivery(settings, codec, keys)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stopping.set)
        try:
            await worker.run()
        finally:
            if keys is not None:
                await keys.stop()

    uvloop.run(run())
    return 0
