"""The contract's murmur2 picks the partition Kafka's producers pick: it must equal the client's hash."""

import random

from aiokafka.partitioner import murmur2 as client_murmur2
from hypothesis import given
from hypothesis import strategies as st

from events.topics import COMMANDS, EVENTS, VECTORS, murmur2


@given(st.binary(max_size=200))
def test_murmur2_equals_the_kafka_clients_on_any_bytes(data):
    assert murmur2(data) == client_murmur2(data)


def test_murmur2_equals_the_kafka_clients_on_many_keys():
    rng = random.Random(19)
    keys = [f"t{rng.randrange(10**6)}/agent-{rng.randrange(10**9)}".encode() for _ in range(20_000)]
    keys += [rng.randbytes(n) for n in range(0, 64) for _ in range(50)]
    for key in keys:
        assert murmur2(key) == client_murmur2(key), key


def test_partition_of_matches_the_default_partitioner():
    for key in (b"", b"t/a", "tenant/ägent".encode(), b"x" * 1000):
        for topic in (COMMANDS, EVENTS, VECTORS):
            assert topic.partition_of(key) == (client_murmur2(key) & 0x7FFFFFFF) % topic.partitions
