"""The topic registry: names, keys and partition counts (the choices: docs/reference/topics.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (its Java client's `Utils.murmur2`), the hash its default partitioner
    takes: here so the contract computes partitions without a Kafka client."""
    n = len(data)
    h = 0x9747B28C ^ n
    end = n - n % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little") * _M & _MASK
        k = (k ^ (k >> 24)) * _M & _MASK
        h = (h * _M & _MASK) ^ k
    tail = n % 4
    if tail >= 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h = (h ^ data[end]) * _M & _MASK
    h = (h ^ (h >> 13)) * _M & _MASK
    return h ^ (h >> 15)


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
# The ledger's answers to a command it had decided before (a retry, a redelivery, another
# caller's reuse of its id): copies of its events for whoever waits on the id, kept a day. The
# event log itself holds each decision once. Partitioned as the events are.
REPLIES = Topic("memlane.memory.replies", 8, agent_key, config={"retention.ms": str(24 * 3600 * 1000)})
# Vectors of history parts, keyed by model and part (`events.rules.history.point_id` as the
# content hash), each in the partition of its turn: the embedding worker that reads turns
# partition p writes them to partition p, so as many workers share them as share the turns.
HISTORY_VECTORS = Topic("memlane.history.vectors", TURNS.partitions, vector_key, compacted=True,
                        config={"cleanup.policy": "compact"})


def vector_partition(event_partition: int) -> int:
    """The `memlane.vectors` partition for a record of event partition `event_partition`.

    A vector goes beside the agents whose records need it, not where its key hashes to,
    so a memory shard reads only its own agents' vectors. A text that records in several
    partitions share is embedded once and sent to each (compaction keeps one copy per
    partition)."""
    return event_partition % VECTORS.partitions


def vector_partitions(event_partitions: list[int]) -> list[int]:
    return sorted({vector_partition(p) for p in event_partitions})


TOPICS: dict[str, Topic] = {t.name: t for t in (TURNS, COMMANDS, EVENTS, VECTORS, USAGE, HISTORY_VECTORS)}


def keys_topic(segment_ms: int = 3_600_000) -> Topic:
    """`memlane.keys`: wrapped data keys under `subject#kid`, compacted, so a destroyed key's
    tombstone removes it from the broker's disks. `segment.ms` closes the segment a key sits
    in (compaction never touches the open one), `max.compaction.lag.ms` makes the cleaner take
    it within that time, and `delete.retention.ms` is how long the tombstone itself stays for
    a reader that is behind. A destroyed key is physically gone within about
    segment.ms + max.compaction.lag.ms (docs/features/encryption-and-erasure.md)."""
    return Topic("memlane.keys", 1, lambda k: f"{k.subject}#{k.kid}", compacted=True, config={
        "cleanup.policy": "compact",
        "segment.ms": str(segment_ms),
        "max.compaction.lag.ms": str(segment_ms),
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "86400000",
    })


# API keys by digest (events/api_keys.py, docs/features/api-keys.md). Compacted, and never tombstoned:
# a revocation is the key's last value, so the cleaner can never forget it. One partition: one
# order over every key, and one position for a follower to be caught up to.
API_KEYS = Topic("memlane.apikeys", 1, lambda r: r.topic_key.decode(), compacted=True,
                 config={"cleanup.policy": "compact"})

# How long a web sign-in lasts.
WEB_SESSION_TTL_S = 8 * 3600
# Web sessions by the hash of their cookie (events/web_sessions.py), so a lost Redis keeps every
# live sign-in. Compacted (a sign-out's tombstone ends one) and deleted past a session's life:
# nothing of an ended session stays on the broker.
WEB_SESSIONS = Topic("memlane.websessions", 1, lambda r: r, compacted=True, config={
    "cleanup.policy": "compact,delete", "retention.ms": str(WEB_SESSION_TTL_S * 1000),
    "delete.retention.ms": "3600000"})

# Webhook registrations by tenant/id (events/webhooks.py): compacted, a removal is a key's last value.
WEBHOOKS = Topic("memlane.webhooks", 1, lambda r: f"{r.tenant}/{r.webhook_id}", compacted=True,
                 config={"cleanup.policy": "compact"})
# Deliveries parked after their last attempt, and the operator's replays of them, by tenant; kept.
WEBHOOKS_DEAD = Topic("memlane.webhooks.dead", 1, lambda r: r.tenant, config={"retention.ms": "-1"})
