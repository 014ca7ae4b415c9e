"""The topic registry: names, keys and partition counts (DESIGN.md, "Topics and keys")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.partitioner import murmur2


def agent_key(m: Any) -> str:
    return f"{m.tenant}/{m.agent}"


def session_key(m: Any) -> str:
    return f"{m.tenant}/{m.agent}/{m.session or '-'}"


def vector_key(m: Any) -> str:
    return f"{m.model}/{m.content_hash}"


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: Callable[[Any], str]
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)

    @property
    def dlq(self) -> str:
        return f"{self.name}.dlq"

    def key_bytes(self, message: Any) -> bytes:
        return self.key(message).encode()

    def partition_of(self, key: bytes) -> int:
        """The partition Kafka's default partitioner (murmur2, as aiokafka's and Java's
        producers use) writes `key` to."""
        return (murmur2(key) & 0x7FFFFFFF) % self.partitions


# The header of an event the ledger writes again for a redelivered command. Its original
# is earlier in the same partition, so a fold in log order has applied it already: a
# projection skips it (after a restart it no longer knows the record's newer versions).
REDELIVERED = "memlane-redelivered"

# Over-partitioned from the start: adding partitions later remaps keys.
TURNS = Topic("memlane.turns", 8, session_key)
COMMANDS = Topic("memlane.memory.commands", 8, agent_key)
EVENTS = Topic("memlane.memory.events", 8, agent_key, config={"retention.ms": "-1"})
VECTORS = Topic("memlane.vectors", 4, vector_key, compacted=True, config={"cleanup.policy": "compact"})
USAGE = Topic("memlane.usage", 4, agent_key)


def vector_partition(event_partition: int) -> int:
    """The `memlane.vectors` partition for a record of event partition `event_partition`.

    A vector goes beside the agents whose records need it, not where its key hashes to,
    so a memory shard reads only its own agents' vectors. A text that records in several
    partitions share is embedded once and sent to each (compaction keeps one copy per
    partition)."""
    return event_partition % VECTORS.partitions


def vector_partitions(event_partitions: list[int]) -> list[int]:
    return sorted({vector_partition(p) for p in event_partitions})


TOPICS: dict[str, Topic] = {t.name: t for t in (TURNS, COMMANDS, EVENTS, VECTORS, USAGE)}
