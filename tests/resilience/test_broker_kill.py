"""Kill -9 one broker of a 3-node Kafka cluster (RF 3, min.insync.replicas 2) during a burst of
turns: nothing acknowledged is lost, nothing is doubled, and the Redis view equals the pure
fold of the event log the surviving brokers hold (docs/operations/kafka-replication.md)."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.broker_kill_support import (
    REPLICATED,
    WORKERS,
    Cluster,
    broker_kill_round,
    cluster_stack,
    replication,
)

TURNS = 80


@pytest.fixture(scope="module")
def kafka_cluster():
    c = Cluster(stop_s=3)
    bootstrap = c.start()
    try:
        yield c, bootstrap
    finally:
        c.clean()


# A stack of its own: it runs on a three-broker cluster that the test kills a broker of.
@pytest.fixture(scope="module")
def replicated_stack(kafka_cluster, settings, infra, tmp_path_factory):
    c, bootstrap = kafka_cluster
    prefix = f"{settings.topic_prefix}bk{uuid.uuid4().hex[:4]}."
    s = cluster_stack(bootstrap, prefix, tmp_path_factory.mktemp("broker-kill"), infra)
    try:
        s.start_all(WORKERS)
        yield s
    finally:
        s.stop()


async def test_broker_kill_during_turn_burst_loses_and_doubles_nothing(kafka_cluster, replicated_stack, settings):
    c, bootstrap = kafka_cluster
    prefix = replicated_stack.env["MEMLANE_TOPIC_PREFIX"]
    # memlane made its topics (a DLQ and the keys topic among them) with the settings'
    # replication: three copies, two of them needed for a write.
    rep = await replication(bootstrap, [prefix + t for t in REPLICATED])
    assert rep == {prefix + t: ({3}, "2") for t in REPLICATED}, rep

    res = await broker_kill_round(c, bootstrap, replicated_stack, settings.redis_url, turns=TURNS)
    print(f"broker kill: node {res.victim} (event partitions {res.victim_led}) at {res.events_at_kill} event "
          f"offsets; {res.acked} turns in {res.burst_s:.1f} s, the log paused {res.pause_s:.1f} s, "
          f"{res.redelivered} redelivered copies")
    assert res.victim_led, f"node {res.victim} led no partition of the event log: {res}"
    assert res.acked == TURNS, res
    assert res.lost == [], f"{len(res.lost)} acknowledged turns have no record after kill -9 of node {res.victim}"
    assert res.duplicated == [], f"{len(res.duplicated)} turns have more than one record"
    assert res.doubled_events == [], f"{len(res.doubled_events)} events logged twice without the redelivery mark"
    assert res.view_differs == [], res.view_differs[:10]
