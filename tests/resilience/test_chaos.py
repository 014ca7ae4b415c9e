"""Kill -9 each process during a write burst: every acknowledged write stays readable
exactly once and searchable, and every acknowledged turn reaches history."""

from __future__ import annotations

import pytest

from services.stack import Stack, free_port, stack_env
from tests.e2e.chaos_support import VICTIMS, chaos_round


@pytest.fixture(scope="module")
def chaos_stack(settings, infra, tmp_path_factory):
    # A stack of its own: the rounds kill its processes, which other modules' stack must not see.
    data = tmp_path_factory.mktemp("chaos")
    env = stack_env(MEMLANE_TOPIC_PREFIX=f"{settings.topic_prefix}chaos.", MEMLANE_DATA_DIR=str(data),
                    MEMLANE_API_PORT=str(free_port()), **infra)
    s = Stack(env, data / "logs")
    try:
        s.start_all()
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("victim", VICTIMS)
async def test_kill_during_write_burst_loses_nothing(chaos_stack, settings, victim):
    # The API holds the memory index; a kill loses records only when it lands between a
    # checkpoint and the vectors it waited for, so it is killed in several bursts.
    for _ in range(3 if victim == "api" else 1):
        await _round(chaos_stack, settings, victim)


async def _round(chaos_stack, settings, victim):
    res = await chaos_round(chaos_stack, settings.operator_key, settings.kafka_bootstrap,
                            chaos_stack.env["MEMLANE_TOPIC_PREFIX"], victim, writes=300, turns=40, kill_after=0.5)
    assert res.writes_acked >= 290 and res.turns_acked == 40, res
    assert res.lost == [], f"{len(res.lost)} acknowledged writes never became readable after kill -9 of {victim}"
    assert res.duplicated == [], f"{len(res.duplicated)} writes readable twice after kill -9 of {victim}"
    assert res.unsearchable == [], f"{len(res.unsearchable)} readable records not searchable after kill -9 of {victim}"
    assert res.history_missing == [], f"{len(res.history_missing)} turns missing from history after kill -9 of {victim}"
