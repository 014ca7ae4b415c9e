"""One message never stops the ledger, and one agent's command id never answers another's.

The ledger's `process` and the runner's per-message step, without a broker: the e2e module
`tests/e2e/test_hardening_ledger.py` runs the same against the real stack.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from events import AddMemory, CommandRejected
from events.codec import PLAIN, decode, encode
from events.lean import decode_lean
from events.limits import EVENT_LIMIT, MESSAGE_LIMIT
from events.rules.ledger import LedgerState
from events.topics import COMMANDS, EVENTS
from settings import Settings
from workers.processors.ledger import processor as ledger_mod
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands
from workers.runtime.runner import DeadLetter, Out, Processor, Runner, fits

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def fresh_ledger() -> LedgerProcessor:
    ledger = LedgerProcessor(Settings(), codec=PLAIN)
    ledger.states[0], ledger.processed[0] = LedgerState(), RecentCommands()
    return ledger


def events_of(outs) -> list:
    return [decode(EVENTS.name, o.value) for o in outs if isinstance(o, Out) and o.topic == EVENTS.name]


async def test_two_tenants_reusing_a_command_id_each_get_their_own_record():
    ledger = fresh_ledger()
    tb = AddMemory(command_id="idem-key-0002", tenant="tb", agent="a", issued_at=NOW, summary="tb's text", session="s")
    ta = tb.model_copy(update={"tenant": "ta", "summary": "ta's text"})
    first = events_of(await ledger.process(COMMANDS.name, 0, 0, tb))
    second = events_of(await ledger.process(COMMANDS.name, 0, 1, ta))
    assert [(e.type, e.record.tenant, e.record.summary) for e in second] == [("RecordAdded", "ta", "ta's text")]
    assert second[0].record.id != first[0].record.id
    assert len(ledger.states[0].records) == 2
    # A redelivery is still recognised, per tenant and agent.
    again = await ledger.process(COMMANDS.name, 0, 2, ta)
    assert [o.value for o in again] == [encode(second[0])]


async def test_an_event_over_the_message_limit_becomes_a_refusal_naming_the_field():
    """A command logged before the limits existed (the contract refuses it now): its event
    would not fit the broker, so the ledger answers with a refusal and moves on."""
    ledger = fresh_ledger()
    old = AddMemory(command_id="big", tenant="t", agent="a", issued_at=NOW, summary="s", session="s")
    old = old.model_copy(update={"metadata": {"blob": "m" * 1_047_600}})  # unvalidated, as decoded before
    outs = await ledger.process(COMMANDS.name, 0, 0, old)
    [e] = events_of(outs)
    assert (e.type, e.code, e.field) == ("CommandRejected", "LIMIT_EXCEEDED", "metadata")
    assert f"over the limit of {EVENT_LIMIT} bytes" in e.reason
    assert all(fits(o) for o in outs) and not ledger.states[0].records
    # The refusal is what a redelivery gets back.
    assert [o.value for o in await ledger.process(COMMANDS.name, 0, 1, old)] == [o.value for o in outs]


async def test_a_rule_that_fails_answers_the_caller_and_parks_the_command(monkeypatch):
    ledger = fresh_ledger()

    def broken(state, cmd, *_):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ledger_mod, "decide", broken)
    cmd = AddMemory(command_id="c1", tenant="t", agent="a", issued_at=NOW, summary="s", session="s")
    outs = await ledger.process(COMMANDS.name, 0, 0, cmd)
    [e] = events_of(outs)
    assert (e.type, e.code, e.last) == ("CommandRejected", "COMMAND_FAILED", True)
    assert [o.error for o in outs if isinstance(o, DeadLetter)] == ["RuntimeError: a bug"]
    assert decode_lean(outs[0].value).command_id == "c1"


class Emits(Processor):
    name = "emits"
    sources = (COMMANDS.name,)

    def __init__(self, settings, size: int) -> None:
        super().__init__(settings, codec=PLAIN)
        self.size = size

    def decode(self, source, data):
        return data

    async def process(self, source, partition, offset, value):
        return [Out(EVENTS.name, b"k", b"small"), Out(EVENTS.name, b"k", b"x" * self.size)]


def message(value: bytes) -> SimpleNamespace:
    return SimpleNamespace(topic=COMMANDS.name, partition=3, offset=42, key=b"t/a", value=value, headers=())


@pytest.mark.parametrize("input_size", [100, MESSAGE_LIMIT - 200])
async def test_a_message_whose_output_would_not_fit_is_parked_not_sent(input_size):
    runner = Runner(Emits(Settings(), MESSAGE_LIMIT), Settings(), group="g")
    outs = await runner._one(message(b"i" * input_size))
    [dlq] = outs
    assert dlq.topic == f"{COMMANDS.name}.dlq" and fits(dlq)
    headers = dict(dlq.headers)
    assert b"over the message limit" in headers["error"] and headers["source_offset"] == b"42"
    if input_size > 100:
        # Near the limit, the input itself no longer fits beside its headers: they go alone.
        assert dlq.value == b"" and headers["value_dropped"] == str(input_size).encode()
    else:
        assert dlq.value == b"i" * input_size


async def test_outputs_that_fit_go_out_unchanged():
    runner = Runner(Emits(Settings(), 1000), Settings(), group="g")
    assert [o.value for o in await runner._one(message(b"i"))] == [b"small", b"x" * 1000]


async def test_a_wait_for_one_agents_command_is_not_resolved_by_anothers(tmp_path):
    from projections.qdrant.index import EdgeIndex
    from workers.followers.qdrant_projection import QdrantProjection

    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0], codec=PLAIN)
    try:
        mine = proj.wait_for("idem", "ta", "a")

        def rejected(tenant):
            return decode_lean(encode(CommandRejected(event_id="e", command_id="idem", tenant=tenant, agent="a",
                                                      occurred_at=NOW, code="X", reason="r")))

        proj._command_done(rejected("tb"))
        await asyncio.sleep(0)
        assert not mine.done()
        proj._command_done(rejected("ta"))
        assert [e.tenant for e in await asyncio.wait_for(mine, 1)] == ["ta"]
    finally:
        proj.index.close()


async def test_a_reply_answers_its_waiter_only_once_the_events_before_it_are_applied(tmp_path):
    """The ledger's answer to a retried command (`REPLIES`) waits until the projection has read
    and applied its events partition up to where it ended when the answer was read: the
    command's own events, committed with it or before, are then searchable."""
    from projections.qdrant.index import EdgeIndex
    from workers.followers.qdrant_projection import QdrantProjection

    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0], codec=PLAIN)
    try:
        waiter = proj.wait_for("idem", "ta", "a")
        answer = decode_lean(encode(CommandRejected(event_id="e", command_id="idem", tenant="ta", agent="a",
                                                    occurred_at=NOW, code="X", reason="r")))
        proj.replies.append(("events:0", 10, answer))
        proj.applied_to["events:0"] = 9  # the partition's last commit marker not passed yet
        proj._answer_replies()  # resolves a waiter there and then, or not at all
        assert not waiter.done() and proj.replies
        proj.applied_to["events:0"] = 10
        proj._answer_replies()
        assert [e.command_id for e in await asyncio.wait_for(waiter, 1)] == ["idem"] and not proj.replies
    finally:
        proj.index.close()
