"""Transactional ids stable per worker instance, and the bounded rejoin after a refused commit.

The broker side (a second producer with the same id fencing a live worker, which rejoins) is in
tests/integration/test_fencing.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaConnectionError,
    KafkaError,
    ProducerFenced,
)

from events.codec import PLAIN
from services.supervisor import Child, env_of, instance_base, instances, plan
from settings import Settings
from workers.runtime.runner import (
    REJOIN_LIMIT,
    REJOIN_WINDOW_S,
    Fenced,
    Processor,
    Runner,
    lost_ownership,
    too_many_rejoins,
    transactional_id,
)


class Txn(Processor):
    name = "ledger"
    sources = ("memlane.commands",)
    transactional = True

    def __init__(self, settings) -> None:
        super().__init__(settings, codec=PLAIN)
        self.revocations: list[set] = []

    async def revoked(self, partitions):
        self.revocations.append(set(partitions))


def txid(**settings) -> str | None:
    s = Settings(**settings)
    return Runner(Txn(s), s).transactional_id


def test_an_instance_gets_the_same_id_at_every_start():
    assert txid(worker_instance="host-1a2b3c.1") == txid(worker_instance="host-1a2b3c.1") == \
        "memlane.ledger.host-1a2b3c.1"
    assert transactional_id("g", "i", fresh=lambda: pytest.fail("an instance needs no random part")) == "g.i"


def test_ids_differ_across_replicas_deployments_and_workers():
    ids = {txid(worker_instance="h.1"), txid(worker_instance="h.2"),
           txid(worker_instance="h.1", topic_prefix="staging."), txid(worker_instance="h.1", group_prefix="other")}
    assert len(ids) == 4
    s = Settings(worker_instance="h.1")
    other = type("Other", (Txn,), {"name": "trust"})  # a companion in the same process: its own group
    assert Runner(other(s), s).transactional_id != txid(worker_instance="h.1")


def test_without_an_instance_each_start_takes_a_random_id_and_a_plain_worker_none():
    assert txid() != txid()
    assert txid().startswith("memlane.ledger.")
    s = Settings(worker_instance="h.1")
    plain = type("Plain", (Txn,), {"transactional": False})
    assert Runner(plain(s), s).transactional_id is None


def test_the_supervisor_numbers_each_kinds_replicas_and_keeps_the_api_out():
    children = plan(["ledger", "embedding", "api"], {"ledger": 2})
    assert instances(children, "h-abc") == {"ledger.1": "h-abc.1", "ledger.2": "h-abc.2", "embedding": "h-abc.1"}
    # The groups differ by kind, so ledger.1 and embedding share an instance but not an id.


def test_each_supervisor_names_its_children_apart_and_alike_across_its_restarts():
    a, b = Path("/srv/a/supervisor.json.lock"), Path("/srv/b/supervisor.json.lock")
    assert instance_base("", "host", a) == instance_base("", "host", a)
    assert len({instance_base("", "host", a), instance_base("", "host", b), instance_base("", "other", a)}) == 3
    assert instance_base("rack1-m3", "host", a) == "rack1-m3"  # MEMLANE_WORKER_INSTANCE, set per machine


def test_a_child_starts_with_its_instance_and_the_api_without_one():
    env = {"MEMLANE_TOPIC_PREFIX": "p."}
    worker = Child("ledger.2", "ledger", Path("/tmp/l.log"), instance="h-abc.2", probe_port=9100)
    assert env_of(env, worker) == {**env, "MEMLANE_WORKER_INSTANCE": "h-abc.2", "MEMLANE_METRICS_PORT": "9100"}
    assert env_of(env, Child("api", "api", Path("/tmp/a.log"))) == env


def test_ownership_errors_are_found_through_what_wraps_them():
    wrapped = KafkaError("Unexpected error during batch delivery")
    wrapped.__cause__ = IllegalGenerationError()
    assert isinstance(lost_ownership(wrapped), IllegalGenerationError)
    assert isinstance(lost_ownership(ProducerFenced()), ProducerFenced)
    assert lost_ownership(KafkaConnectionError()) is None and lost_ownership(RuntimeError("x")) is None


def test_rejoins_are_counted_within_the_window():
    assert not too_many_rejoins([0.0] * (REJOIN_LIMIT - 1), 1.0)
    assert too_many_rejoins([0.0] * REJOIN_LIMIT, 1.0)
    assert not too_many_rejoins([0.0] * REJOIN_LIMIT, REJOIN_WINDOW_S + 1)  # long ago: a passing event


class Fake:
    """A consumer or producer as the rejoin uses it."""

    def __init__(self, assignment=()) -> None:
        self._assignment, self.stopped = set(assignment), False

    def assignment(self):
        return self._assignment

    async def stop(self):
        self.stopped = True


async def test_a_refused_worker_starts_over_and_gives_up_when_refused_again_and_again():
    s = Settings(worker_instance="h-abc.1")
    r = Runner(Txn(s), s)
    tp = TopicPartition("memlane.commands", 3)
    opened: list[str] = []

    async def open_producer():
        opened.append("producer")
        r.producer = Fake()

    async def open_consumer():
        opened.append("consumer")
        r.consumer = Fake([tp])

    r._open_producer, r._open_consumer = open_producer, open_consumer
    await open_producer()
    await open_consumer()
    for _ in range(REJOIN_LIMIT):
        old_producer, old_consumer = r.producer, r.consumer
        r.commit_error = ProducerFenced()
        await r._rejoin(r.commit_error)
        assert old_producer.stopped and old_consumer.stopped and r.consumer is not old_consumer
        assert r.commit_error is None and r.processor.revocations[-1] == {tp}
    assert opened == ["producer", "consumer"] * (REJOIN_LIMIT + 1)
    with pytest.raises(Fenced, match="h-abc.1.*MEMLANE_WORKER_INSTANCE"):
        await r._rejoin(ProducerFenced())
    assert len(opened) == 2 * (REJOIN_LIMIT + 1)  # given up: nothing rebuilt


async def test_a_group_that_moved_on_rejoins_a_plain_worker_with_its_producer_kept():
    s = Settings()
    plain = type("Plain", (Txn,), {"transactional": False})(s)
    r = Runner(plain, s)
    r.producer, r.consumer = Fake(), Fake()
    kept = r.producer

    async def open_consumer():
        r.consumer = Fake()

    r._open_consumer = open_consumer
    await r._rejoin(CommitFailedError())
    assert r.producer is kept and not kept.stopped

