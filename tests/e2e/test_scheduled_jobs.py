"""memlane's scheduled jobs run inside it, with no command from outside (docs/operations/scheduled-jobs.md):
the ledger sweeps expired records on its own tick, and the API process builds and swaps to an
optimised memory generation once a shard's unindexed points pass the threshold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from events.commands import AddMemory
from events.config import AgentConfig
from events.memory import RecordExpired
from events.rules.ledger import record_id_for
from events.topics import COMMANDS, EVENTS
from services.bootstrap import index_generations
from services.client import MemlaneClient
from tests.conftest import eventually
from tests.e2e.extraction_support import new_agent, read_topic, send_to
from tests.stacks import JOBS_PROFILE
from workers.followers.memory_shards import shard_of
from workers.jobs.optimize_policy import read_left

THRESHOLD = int(JOBS_PROFILE["MEMLANE_OPTIMIZE_UNINDEXED_POINTS"])
AGENT_SCOPE = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})


@pytest.fixture(scope="module")
def sstack(jobs_stack):
    # The jobs stack: on the model stack its 2 s retention pass would race the sweep (expiring as
    # "retention"), and the optimiser would rebuild the whole shared log.
    return jobs_stack


async def test_the_ledger_sweeps_expired_records_on_its_own(sstack):
    stack, settings = sstack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, AGENT_SCOPE)
    async with MemlaneClient(stack.api_url, key) as c:
        # Written ten minutes ago to expire five minutes later: time has passed, not waited for.
        written = datetime.now(UTC) - timedelta(minutes=10)
        soon = written + timedelta(minutes=5)
        short = AddMemory(command_id=str(uuid.uuid4()), tenant=tenant, agent=agent, issued_at=written,
                          summary="Scheduled sweep short-lived fact", scope="AGENT", expires_at=soon)
        await send_to(settings, COMMANDS, short)
        rid = record_id_for(tenant, agent, short.command_id)
        kept = (await c.add_memory("Scheduled sweep lasting fact", scope="AGENT"))["id"]

        async def expired():
            events = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
                      if isinstance(e, RecordExpired) and e.agent == agent]
            return events or None

        [event] = await eventually(expired, timeout=60, interval=0.5)
        assert event.record.id == rid and event.record.status.value == "DELETED"
        assert event.provenance.modified_by == "schedule"  # the ledger's own schedule, not `memlane sweep`
        assert event.occurred_at >= soon

        async def deleted():
            return (await c.read_memory(rid)).status.value == "DELETED"

        await eventually(deleted, timeout=30)
        assert (await c.read_memory(kept)).status.value == "ACTIVE"


async def test_the_api_optimises_a_shard_past_the_threshold_and_swaps_to_it(sstack):
    stack, settings = sstack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, AGENT_SCOPE)
    async with MemlaneClient(stack.api_url, key) as c:
        before = (await c.health())["projection"]["generation"]
        assert before == index_generations(settings).current()
        for i in range(THRESHOLD + 3):
            await c.add_memory(f"Optimise policy fact number {i} about the harbour crane {i}", scope="AGENT")

        async def swapped():
            gen = (await c.health())["projection"]["generation"]
            return gen if gen > before else None

        after = await eventually(swapped, timeout=120, interval=0.5)
        assert index_generations(settings).current() == after
        # The optimise wrote what it left unindexed beside the agent's shard (at least what made
        # it due): this small a shard stays a full scan, and only what comes after counts.
        paths = index_generations(settings).paths(after)
        assert read_left(paths[shard_of(tenant, agent, len(paths))]) >= THRESHOLD

        async def found():
            hits, _ = await c.search_memory("harbour crane", limit=50)
            return hits if len(hits) == THRESHOLD + 3 else None

        await eventually(found, timeout=30)
        # Nothing new since: no second optimise starts, however often the process looks (every 1 s):
        # three looks that began after this point have ended.
        looks = optimize_checks(stack.api_url)
        await eventually(lambda: optimize_checks(stack.api_url) >= looks + 4, timeout=60, interval=0.5)
        assert (await c.health())["projection"]["generation"] == after == index_generations(settings).current()


def optimize_checks(api_url: str) -> float:
    """The API process's count of looks at whether an optimise is due (its /metrics)."""
    text = httpx.get(f"{api_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "memlane_index_optimize_checks":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("the API serves no memlane_index_optimize_checks_total")
