"""The API routes an agent's searches to the shard that folds the agent's event partitions."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from events.topics import EVENTS
from workers.followers.memory_shards import shard_of, shard_partitions


@given(tenant=st.text(min_size=1, max_size=20), agent=st.text(min_size=1, max_size=40), shards=st.integers(1, 8))
def test_an_agent_shard_holds_the_partition_its_events_are_written_to(tenant, agent, shards):
    partitions = list(range(EVENTS.partitions))
    written_to = DefaultPartitioner()(f"{tenant}/{agent}".encode(), partitions, partitions)
    assert written_to in shard_partitions(shard_of(tenant, agent, shards), shards)


def test_shards_split_the_partitions_between_them():
    for shards in range(1, EVENTS.partitions + 1):
        owned = [p for k in range(shards) for p in shard_partitions(k, shards)]
        assert sorted(owned) == list(range(EVENTS.partitions))
