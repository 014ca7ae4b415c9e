"""Kill -9 each process at a named point of a write burst (workers.faults): every acknowledged
write stays readable exactly once and searchable, and every acknowledged turn reaches history."""

from __future__ import annotations

import pytest

from tests.e2e.chaos_support import VICTIMS, chaos_round

# Where each victim kills itself: the API just after a memory-index checkpoint that events still
# wait on for their vectors (where a lost record would come from); a transactional worker with its
# outputs sent and the transaction open; the others between applying a batch and committing it.
FAULTS = {
    "api": "memory_index.checkpoint_with_parked",
    "ledger": "ledger.before_commit@3",
    "redis-projection": "redis-projection.before_commit@3",
    "embedding": "embedding.before_commit@3",
    "extraction": "extraction.before_commit",
    "history": "history.before_commit",
}


# The API's point comes with its first checkpoint, seconds into a burst: it gets the longer one.
WRITES = {"api": 300}


@pytest.mark.parametrize("victim", VICTIMS)
async def test_kill_during_write_burst_loses_nothing(stack, settings, victim):
    # The session stack: each round starts what it killed again, so the next test sees it whole.
    writes = WRITES.get(victim, 150)
    res = await chaos_round(stack, settings.operator_key, settings.kafka_bootstrap,
                            stack.env["MEMLANE_TOPIC_PREFIX"], victim, writes=writes, turns=40, fault=FAULTS[victim])
    assert res.writes_acked >= writes - 10 and res.turns_acked == 40, res
    assert res.lost == [], f"{len(res.lost)} acknowledged writes never became readable after kill -9 of {victim}"
    assert res.duplicated == [], f"{len(res.duplicated)} writes readable twice after kill -9 of {victim}"
    assert res.unsearchable == [], f"{len(res.unsearchable)} readable records not searchable after kill -9 of {victim}"
    assert res.history_missing == [], f"{len(res.history_missing)} turns missing from history after kill -9 of {victim}"
