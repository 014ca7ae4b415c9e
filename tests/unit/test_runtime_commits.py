"""The runner commits a poll while it processes the next one, one commit at a time, in
order, and never past a commit that failed.

Kafka itself is not needed for these rules: `_commit` is replaced by a recorder, so each
test decides when a commit ends and whether it fails. The end-to-end tests run the same
loop against the broker.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from events.codec import PLAIN
from settings import Settings
from workers.runtime.runner import Out, Processor, Runner


class Echo(Processor):
    name = "echo"
    sources = ("memlane.turns",)

    def decode(self, source, data):
        return data

    # How many batches and ticks it has finished: a test's barrier, instead of a sleep.
    batches = 0
    ticks = 0

    async def process(self, source, partition, offset, value):
        return [Out("memlane.commands", b"k", value)]

    async def batch_done(self):
        self.batches += 1
        return []

    async def tick(self):
        self.ticks += 1
        return [Out("memlane.commands", b"k", b"due")]


class Commits:
    """Stands in for `Runner._commit`: each commit waits until the test releases it."""

    def __init__(self) -> None:
        self.started: list[dict] = []
        self.outs: list[list[bytes]] = []
        self.ended: list[dict] = []
        self.release: list[asyncio.Future] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, offsets, outs) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.started.append(offsets)
        self.outs.append([o.value for o in outs])
        done = asyncio.get_running_loop().create_future()
        self.release.append(done)
        try:
            await done
        finally:
            self.in_flight -= 1
        self.ended.append(offsets)


def poll(offset: int) -> dict:
    tp = TopicPartition("memlane.turns", 0)
    return {tp: [SimpleNamespace(topic=tp.topic, partition=0, offset=offset, key=b"k", value=b"v%d" % offset)]}


def runner() -> tuple[Runner, Commits]:
    r = Runner(Echo(Settings(), codec=PLAIN), Settings())
    commits = Commits()
    r._commit = commits
    return r, commits


async def until(cond) -> None:
    for _ in range(100):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


async def test_the_next_poll_is_processed_while_the_last_one_commits():
    r, commits = runner()
    await asyncio.wait_for(r._handle(poll(0)), 5)  # returns with its commit still in flight
    await until(lambda: len(commits.started) == 1)
    second = asyncio.create_task(r._handle(poll(1)))
    await until(lambda: r.processor.batches == 2)
    await until(lambda: r.committing is None)  # it took the first commit to wait for
    # Processed, but its commit waits for the first one to end.
    assert not second.done() and len(commits.started) == 1
    commits.release[0].set_result(None)
    await second
    await until(lambda: len(commits.started) == 2)
    commits.release[1].set_result(None)
    await r.settle()
    assert commits.ended == [{TopicPartition("memlane.turns", 0): 1}, {TopicPartition("memlane.turns", 0): 2}]
    assert commits.most_in_flight == 1


async def test_nothing_commits_after_a_failed_commit():
    r, commits = runner()
    await asyncio.wait_for(r._handle(poll(0)), 5)
    await until(lambda: len(commits.started) == 1)
    commits.release[0].set_exception(RuntimeError("fenced"))
    with pytest.raises(RuntimeError, match="fenced"):
        await r._handle(poll(1))
    assert len(commits.started) == 1


async def test_a_failure_seen_quietly_still_stops_the_next_commit():
    """A rebalance waits for the commit in flight without raising; the failure must still
    stop the next batch from committing offsets past it."""
    r, commits = runner()
    await asyncio.wait_for(r._handle(poll(0)), 5)
    await until(lambda: len(commits.started) == 1)
    commits.release[0].set_exception(RuntimeError("broker gone"))
    await r.settle(quiet=True)
    with pytest.raises(RuntimeError, match="broker gone"):
        await r._handle(poll(1))
    assert len(commits.started) == 1


async def test_a_tick_commits_its_outputs_without_offsets_after_the_commit_in_flight():
    r, commits = runner()
    await asyncio.wait_for(r._handle(poll(0)), 5)
    await until(lambda: len(commits.started) == 1)
    tick = asyncio.create_task(r._tick())
    await until(lambda: r.processor.ticks == 1)
    await until(lambda: r.committing is None)  # it took the batch's commit to wait for
    assert not tick.done() and len(commits.started) == 1  # waits for the batch's commit
    commits.release[0].set_result(None)
    await tick
    await until(lambda: len(commits.started) == 2)
    commits.release[1].set_result(None)
    await r.settle()
    assert commits.started == [{TopicPartition("memlane.turns", 0): 1}, {}]
    assert commits.outs == [[b"v0"], [b"due"]]
