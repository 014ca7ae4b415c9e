"""Kill -9 each process at a named point of a write burst (workers.runtime.faults): every acknowledged
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


async def _round(stack, settings, victim: str) -> None:
    writes = WRITES.get(victim, 150)
    res = await chaos_round(stack, settings.operator_key, settings.kafka_bootstrap,
                            stack.env["MEMLANE_TOPIC_PREFIX"], victim, writes=writes, turns=40, fault=FAULTS[victim])
    assert res.writes_acked >= writes - 10 and res.turns_acked == 40, res
    assert res.lost == [], f"{len(res.lost)} acknowledged writes never became readable after kill -9 of {victim}"
    assert res.duplicated == [], f"{len(res.duplicated)} writes readable twice after kill -9 of {victim}"
    assert res.unsearchable == [], f"{len(res.unsearchable)} readable records not searchable after kill -9 of {victim}"
    assert res.history_missing == [], f"{len(res.history_missing)} turns missing from history after kill -9 of {victim}"


# Each round starts what it killed again, so the next test sees its stack whole.
@pytest.mark.parametrize("victim", [v for v in VICTIMS if v != "api"])
async def test_kill_during_write_burst_loses_nothing(model_stack, victim):
    """On the model stack, whose group is the shorter of the two shared stacks' (its embeddings
    come from the scripted server); the API's round is `test_kill_of_the_api_...` below."""
    stack, settings = model_stack
    await _round(stack, settings, victim)


async def test_kill_of_the_api_during_write_burst_loses_nothing(stack, settings):
    """On the session stack: its point needs events waiting for their vectors at a checkpoint,
    which the embedded model's pace gives and the scripted server's instant vectors rarely do."""
    await _round(stack, settings, "api")
