"""Settings read from the environment."""

import pytest

from settings import Settings


@pytest.mark.parametrize(
    ("value", "off"),
    [("1", True), ("true", True), ("ON", True), (" enabled ", True), ("0", False), ("off", False), ("maybe", False), ("", False)],
)
def test_the_kill_switch_turns_memory_off_only_for_its_four_values(monkeypatch, value, off):
    # 1, true, on and enabled turn memory off; an unreadable value leaves it on.
    monkeypatch.setenv("AGENT_MEMORY_KILL_SWITCH", value)
    assert Settings().memory_kill_switch is off


def test_memory_stays_on_without_the_kill_switch(monkeypatch):
    monkeypatch.delenv("AGENT_MEMORY_KILL_SWITCH", raising=False)
    assert Settings().memory_kill_switch is False
