"""What a test's deployment parked: the messages of one DLQ topic, read from its start."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition


async def dead_letters(s, dlq: str) -> list:
    """Every message of DLQ topic `dlq` in the test's deployment."""
    c = AIOKafkaConsumer(bootstrap_servers=s.kafka_bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(s.topic(dlq), p) for p in sorted(c.partitions_for_topic(s.topic(dlq)) or {0})]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end, out = await c.end_offsets(tps), []
        while [t for t in tps if await c.position(t) < end[t]]:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out += msgs
        return out
    finally:
        await c.stop()
