"""Whom an announcement of the record view wakes, and the checkpoint key every reader uses."""

from __future__ import annotations

from aiokafka import TopicPartition

from projections.redis.applied_waiter import Waiters, announcement, block_key, command_key, record_key
from workers.runtime.topic_reader import checkpoint_key, key_partition, of_topic, reached, read_so_far


async def test_a_record_waiter_wakes_only_at_its_version_or_later():
    w = Waiters()
    v3 = w.watch(record_key("t", "a", "r1"), 3)
    other_agent = w.watch(record_key("t", "b", "r1"), 1)
    assert w.applied(announcement([("t/a", "r1", 2)], [])) == 0 and not v3.done()
    assert w.applied(announcement([("t/a", "r2", 9)], [])) == 0 and not v3.done()
    assert w.applied(announcement([("t/a", "r1", 4), ("t/a", "r1", 5)], [])) == 1 and v3.done()
    assert not other_agent.done()


async def test_a_block_waiter_wakes_on_any_change_of_its_label():
    w = Waiters()
    fut = w.watch(block_key("t", "a", "persona"))
    assert w.applied(announcement([], [("t/a", "style", "c1")])) == 0
    assert w.applied(announcement([], [("t/a", "persona", "c2")])) == 1 and fut.done()


async def test_a_commands_change_is_confirmed_by_its_own_announcement_heard_before_or_after():
    w = Waiters()
    mine = command_key("t", "a", "c2")
    fut = w.watch(mine)
    assert w.applied(announcement([], [("t/a", None, "c1"), ("t/b", "persona", "c2")])) == 0 and not fut.done()
    # A concurrent writer's change may come in the same message: each command is its own.
    assert w.applied(announcement([], [("t/a", "persona", "c3"), ("t/a", "persona", "c2")])) == 1 and fut.done()
    assert w.announced(mine) and w.announced(command_key("t", "a", "c1")) and not w.announced(command_key("t", "a", "c9"))
    for i in range(Waiters.RECENT):
        w.applied(announcement([], [("t/a", None, f"x{i}")]))
    assert not w.announced(mine) and w.announced(command_key("t", "a", f"x{Waiters.RECENT - 1}"))  # a while, not for ever


async def test_forgotten_waiters_and_malformed_messages_wake_nobody():
    w = Waiters()
    key = record_key("t", "a", "r1")
    fut = w.watch(key, 1)
    w.forget(key, fut)
    assert len(w) == 0 and w.applied(announcement([("t/a", "r1", 1)], [])) == 0
    kept = w.watch(key, 1)
    for bad in ("not json", '{"r": [["t/a", "r1"]]}', "[1, 2]", '{"r": 5}'):
        assert w.applied(bad) == 0
    assert not kept.done()
    w.wake_all()
    assert kept.done()


def test_one_checkpoint_key_per_topic_partition():
    key = checkpoint_key("p1.memlane.memory.events", 7)
    assert key == "p1.memlane.memory.events:7" and key_partition(key) == 7
    ckpt = {key: 40, "p1.memlane.memory.events.x:1": 5, "p2.memlane.memory.events:3": 9, "_parked": {}}
    assert of_topic(ckpt, "p1.memlane.memory.events") == {7: 40}
    a, b = TopicPartition("x", 0), TopicPartition("x", 1)
    assert read_so_far({a: 5, b: 12}, {a: 10, b: 10}) == 15
    assert not reached({a: 5, b: 12}, {a: 10, b: 10}) and reached({a: 10, b: 12}, {a: 10, b: 10})


async def test_without_a_subscription_the_view_is_still_read_once():
    class Refusing:  # a Redis that never confirms a subscription
        def pubsub(self):
            raise ConnectionError("refused")

    from projections.redis.applied_waiter import AppliedListener

    listener = AppliedListener(Refusing(), "ch")
    listener.RETRY_S = 0.01
    try:
        async def shown():
            return True

        assert await listener.wait(("r", "t/a", "x"), shown, timeout=0.2) is True
    finally:
        await listener.aclose()
