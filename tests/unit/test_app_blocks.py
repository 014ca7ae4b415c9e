"""Application-scoped blocks (docs/features/recall.md): the ledger keeps an
application's blocks apart from the agent's own and counts them apart, the fold reads an event
without the field as the agent's own, and recall orders the four kinds of block and never shows
another application's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from events import BlockChanged, CurateBlock, codec
from events.commands import WORKSPACE, block_field, block_of_field
from events.lean import decode_ledger_view
from events.rules.ledger import LedgerState, evolve
from services.auth import Principal
from services.memory import Context
from services.memory.reads import MemoryReads, _block_title
from services.memory.usage import UsageLog
from settings import Settings
from tests.fakes.memory_ports import ConfiguredFold, InMemoryUsageRecorder
from tests.unit.test_ledger_rules import NOW, Ledger, only


def test_an_applications_block_is_kept_apart_from_the_agents_block_of_the_same_label():
    led = Ledger()
    assert only(led.curate("style", "add", line="Tabs"), "BlockChanged").application is None
    e = only(led.curate("style", "add", line="Spaces", application="billing"), "BlockChanged")
    assert (e.label, e.text, e.application) == ("style", "Spaces", "billing")
    only(led.curate("style", "add", line="Short answers", application="support"), "BlockChanged")
    assert led.state.blocks == {"t/a": {"style": "Tabs", "billing:style": "Spaces", "support:style": "Short answers"}}
    e = only(led.curate("style", "remove", old="Tabs", application="billing"), "CommandRejected")
    assert (e.code, e.field) == ("NOT_FOUND", "old")  # the agent's line is not the application's
    only(led.curate("style", "remove", old="Spaces", application="billing"), "BlockChanged")
    assert led.state.blocks["t/a"] == {"style": "Tabs", "support:style": "Short answers"}


def test_each_application_and_the_agent_count_their_blocks_apart():
    led = Ledger()
    for i in range(10):
        only(led.curate(f"b{i}", "add", line="x"), "BlockChanged")
        only(led.curate(f"b{i}", "add", line="x", application="app1"), "BlockChanged")
    e = only(led.curate("b10", "add", line="x", application="app1"), "CommandRejected")
    assert (e.code, e.field) == ("LIMIT_EXCEEDED", "label") and "application 'app1' has 10 blocks" in e.reason
    only(led.curate("b10", "add", line="x", application="app2"), "BlockChanged")


def test_an_agent_keeps_blocks_for_ten_applications_at_most():
    led = Ledger()
    for i in range(10):
        only(led.curate("style", "add", line="x", application=f"app{i}"), "BlockChanged")
    e = only(led.curate("style", "add", line="x", application="app10"), "CommandRejected")
    assert (e.code, e.field) == ("LIMIT_EXCEEDED", "application") and "10 applications" in e.reason
    only(led.curate("tone", "add", line="y", application="app3"), "BlockChanged")  # one it has already
    only(led.curate("style", "remove", old="x", application="app3"), "BlockChanged")
    only(led.curate("tone", "remove", old="y", application="app3"), "BlockChanged")  # app3 emptied
    only(led.curate("style", "add", line="x", application="app10"), "BlockChanged")


def test_an_application_is_named_as_a_run_is():
    with pytest.raises(ValidationError, match="application"):
        CurateBlock(command_id="c", tenant="t", agent="a", issued_at=NOW, label="x", action="add", line="y",
                    application="bad:app")


def test_an_event_without_the_field_is_the_agents_own_block_and_recovery_folds_the_application():
    state = LedgerState()
    old = b'{"type":"BlockChanged","event_id":"e1","command_id":"c1","tenant":"t","agent":"a",' \
          b'"occurred_at":"2026-03-01T00:00:00Z","label":"style","text":"Tabs"}'
    assert codec.decode("memlane.memory.events", old).application is None
    evolve(state, decode_ledger_view(old))
    new = BlockChanged(event_id="e2", command_id="c2", tenant="t", agent="a", occurred_at=NOW, label="style",
                       text="Spaces", application="billing")
    evolve(state, decode_ledger_view(codec.encode(new)))
    assert state.blocks == {"t/a": {"style": "Tabs", "billing:style": "Spaces"}}
    assert block_of_field(block_field("style", "billing")) == ("billing", "style")
    assert block_of_field("style") == (None, "style")


async def test_recall_orders_workspace_then_agent_blocks_each_with_the_applications_and_no_other():
    view = ConfiguredFold(configs={})
    reads = MemoryReads(Settings(), view, None, None, UsageLog(InMemoryUsageRecorder(), "m"))
    n = 0
    for agent, label, text, app in [(WORKSPACE, "tone", "Polite", None), (WORKSPACE, "tone", "Formal", "billing"),
                                    (WORKSPACE, "tone", "Casual", "chat"), ("a", "stack", "Python", None),
                                    ("a", "refunds", "Never promise", "billing"), ("a", "emoji", "Yes", "chat"),
                                    ("a", "currency", "EUR", "billing")]:
        n += 1
        await view.apply([BlockChanged(event_id=f"e{n}", command_id=f"c{n}", tenant="t", agent=agent,
                                       occurred_at=datetime(2026, 3, 1, tzinfo=UTC), label=label, text=text,
                                       application=app)])
    ctx = Context(Principal("t", "a", "agent"), "a")
    assert await reads._blocks(ctx, "billing") == [
        ("workspace", "tone", "Polite", None), ("workspace", "tone", "Formal", "billing"),
        ("agent", "stack", "Python", None), ("agent", "currency", "EUR", "billing"),
        ("agent", "refunds", "Never promise", "billing")]
    assert await reads._blocks(ctx) == [("workspace", "tone", "Polite", None), ("agent", "stack", "Python", None)]
    assert [_block_title(s, label, app) for s, label, _, app in await reads._blocks(ctx, "billing")] == [
        "tone (workspace)", "tone (workspace, billing)", "stack", "currency (billing)", "refunds (billing)"]
