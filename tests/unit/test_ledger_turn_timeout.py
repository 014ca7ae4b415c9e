"""The ledger worker times turns out after `turn_timeout_s`, its setting, not a fixed 600 s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events import AddMemory
from events.codec import PLAIN, decode
from events.rules.ledger import LedgerState
from settings import Settings
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands

NOW = datetime(2026, 3, 1, tzinfo=UTC)
COMMANDS = "memlane.memory.commands"


def _ledger(**settings) -> LedgerProcessor:
    ledger = LedgerProcessor(Settings(**settings), codec=PLAIN)
    ledger.states[0], ledger.processed[0] = LedgerState(), RecentCommands()
    return ledger


def _add(command_id: str, at: datetime, **kw) -> AddMemory:
    return AddMemory(command_id=command_id, tenant="t", agent="a", issued_at=at, summary=f"fact {command_id}",
                     session="s1", **kw)


async def _types(ledger: LedgerProcessor, cmd: AddMemory, offset: int) -> list[str]:
    outs = await ledger.process(COMMANDS, 0, offset, cmd)
    return [decode("memlane.memory.events", o.value).type for o in outs]


async def test_a_shorter_turn_timeout_setting_expires_a_turn_sooner():
    short, default = _ledger(turn_timeout_s=30), _ledger()
    for ledger in (short, default):
        assert await _types(ledger, _add("staged", NOW, turn_ref="x:1:1"), 0) == ["WriteStaged"]
    later = _add("later", NOW + timedelta(seconds=31))
    assert await _types(short, later, 1) == ["TurnResolved", "WriteDiscarded", "RecordAdded"]
    assert await _types(default, later, 1) == ["RecordAdded"]  # 600 s by default: still open


async def test_the_ledger_asks_to_expire_a_quiet_agents_turn_after_the_setting():
    short, default = _ledger(turn_timeout_s=30), _ledger()
    for ledger in (short, default):
        await ledger.process(COMMANDS, 0, 0, _add("staged", NOW, turn_ref="x:1:1"))
        ledger.clock = lambda: NOW + timedelta(seconds=30)
    [out] = await short.tick()
    assert decode(COMMANDS, out.value).type == "ExpireTurns"
    assert await default.tick() == []
    default.clock = lambda: NOW + timedelta(seconds=600)
    assert len(await default.tick()) == 1
