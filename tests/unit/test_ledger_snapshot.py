"""A snapshot's state decodes to the state it was taken of."""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

from tests.unit.test_ledger_rules import NOW, Ledger, _outcome_at
from workers.ledger_snapshot import decode_state, encode_state


def test_a_snapshot_holds_every_part_of_the_state():
    led = Ledger(labels={"customer_id": {"number": 5}}, pinned={"max_tokens": 100})
    led.add("pinned fact", pinned=True, labels={"customer_id": "7"}, key="plan")
    later = NOW + timedelta(days=3)  # a later window of outcomes: turns_before holds the first
    led.add("staged, then committed", turn_ref="x:2:1")
    _outcome_at(led, NOW, "x:2:1")
    led.add("staged, then committed later", turn_ref="x:3:1", issued_at=later)
    _outcome_at(led, later, "x:3:1")
    led.add("staged, still open", turn_ref="x:1:1", issued_at=later)
    led.curate("conventions", "add", line="Tabs, not spaces")
    recent = OrderedDict([("c1", [b"e1", b"e2"]), ("c2", [b"e3"])])
    state, kept = decode_state(encode_state(led.state, recent))
    for name in ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "blocks", "stats"):
        assert dict(getattr(state, name)) == dict(getattr(led.state, name)), name
        assert getattr(led.state, name), f"the scenario leaves {name} empty"
    assert state.turns_since == led.state.turns_since
    assert kept == list(recent.items())
