"""Topics as memlane creates them: the deployment's replication factor and min.insync.replicas
(docs/operations/kafka-replication.md); the broker-kill test checks them on a real cluster."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from events.topics import EVENTS, keys_topic
from settings import Settings
from workers.runtime.kafka_io import new_topic


def test_the_single_broker_default_is_one_replica_and_the_brokers_min_isr():
    t = new_topic(Settings(), "x.events", EVENTS.partitions, EVENTS.config)
    assert (t.replication_factor, t.num_partitions, t.topic_configs) == (1, 8, {"retention.ms": "-1"})


def test_a_cluster_gets_three_replicas_and_min_isr_on_top_of_the_registrys_config():
    keys = keys_topic()
    s = Settings(topic_replication_factor=3, topic_min_insync_replicas=2)
    t = new_topic(s, "x.keys", 1, keys.config)
    assert t.replication_factor == 3
    assert t.topic_configs == {**keys.config, "min.insync.replicas": "2"}
    assert "min.insync.replicas" not in keys.config  # the registry's own dict is left alone
    assert new_topic(s, "x.events.dlq", 1).topic_configs == {"min.insync.replicas": "2"}


def test_more_in_sync_replicas_than_replicas_is_refused():
    with pytest.raises(ValidationError, match="MEMLANE_TOPIC_MIN_INSYNC_REPLICAS"):
        Settings(topic_replication_factor=2, topic_min_insync_replicas=3)


async def test_transactional_producers_ask_for_the_deployments_transaction_timeout():
    # A killed worker's open transaction blocks read_committed readers until it times out:
    # aiokafka's own default (60 s) stalled the pipeline a minute after a kill -9 of the ledger.
    # The client keeps the value on its transaction manager, which it sends to the coordinator.
    from workers.runtime.kafka_io import producer

    p = producer(Settings(transaction_timeout_ms=7_000), transactional_id="t")
    try:
        assert p._txn_manager.transaction_timeout_ms == 7_000
        assert producer(Settings(), transactional_id="t")._txn_manager.transaction_timeout_ms == 10_000
    finally:
        await p.stop()
