"""Topics as memlane creates them: the deployment's replication factor and min.insync.replicas
(docs/kafka-replication.md); the broker-kill test checks them on a real cluster."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from events.topics import EVENTS, keys_topic
from settings import Settings
from workers.kafka_io import new_topic


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
