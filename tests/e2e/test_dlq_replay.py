"""`memlane dlq list|show|replay` on a running extraction stack (real Kafka and Redis, the fake
model): a turn whose review times out is dead-lettered, listed, replayed once the model
answers, and its fact is served; a second replay sends nothing; a replay that fails again
returns to the DLQ once, marked as a repeat, and nothing sends it again on its own.

The commands run as subprocesses with the stack's environment, as an operator runs them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from functools import partial

import pytest

from events import AgentConfig
from events.topics import TURNS
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.cli_support import memlane
from tests.e2e.extraction_support import new_agent, turn
from tests.fakes.model_server import Delay, Reply
from tests.stacks import JOBS_PROFILE
from workers.runtime.dlq import REPLAY_COUNT, REPLAY_FOR, REPLAY_OF

TIMEOUT_S = float(JOBS_PROFILE["MEMLANE_MODEL_TIMEOUT_S"])  # the fake answers a Delay far later
LATE = Delay(TIMEOUT_S * 4)


@pytest.fixture(scope="module")
def dstack(jobs_stack):
    # The jobs stack: `memlane dlq replay --all` takes no key filter, and on the model stack it would
    # resend other modules' dead letters.
    return jobs_stack


async def letters(stack) -> list[dict]:
    r = await asyncio.to_thread(memlane, stack, "dlq", "list", TURNS.dlq, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[TURNS.dlq]["messages"]


async def of_session(stack, key: str, n: int) -> list[dict] | None:
    mine = [x for x in await letters(stack) if x["key"] == key]
    return mine if len(mine) >= n else None


def cand(summary: str) -> dict:
    return {"decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": "session", "summary": summary,
            "content": "", "source_message_ids": []}


async def reviewed_behind(settings, fake, tenant: str, agent: str, session: str, n: int) -> None:
    """A barrier, not a sleep: a later turn of the same session (the same partition, behind anything
    a replay sent there) has been reviewed, so what was to come before it has come."""
    m = f"mk{uuid.uuid4().hex[:10]}"
    fake.on(m, Reply({"candidates": []}))
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn(tenant, agent, session, n, f"Thanks, that is all {m}", "You're welcome."))
    await eventually(lambda: fake.requests_with(m) or None, timeout=60)


async def facts(stack, key: str, session: str) -> list[str]:
    async with MemlaneClient(stack.api_url, key, session=session) as c:
        found, _ = await c.search_memory(None, limit=50)
    return [f.record.summary for f in found]


async def test_a_timed_out_review_is_listed_replayed_once_and_its_fact_served(dstack, fake):
    stack, settings = dstack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, AgentConfig())
    m = f"mk{uuid.uuid4().hex[:10]}"
    # Its own marker: a later review may show the fact as an existing memory, which is not
    # the turn's message being asked about again.
    fact = f"Prefers invoices in euros fk{uuid.uuid4().hex[:10]}"
    fake.on(m, LATE, Reply({"candidates": [cand(fact)]}))  # times out first; answers the replay
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn(tenant, agent, "s1", 1, f"Please bill me in euros {m}", "Noted."))

    [letter] = await eventually(partial(of_session, stack, f"{tenant}/{agent}/s1", 1), timeout=60)
    h = letter["headers"]
    assert h["source_topic"] == settings.topic(TURNS.name) and h["consumer_group"].endswith("extraction")
    assert "extraction review" in h["error"] and letter["replayed"] is None and letter["repeat"] == 0
    assert "value" not in letter and m not in json.dumps(letter)  # never the value
    human = memlane(stack, "dlq", "list", TURNS.dlq)
    assert human.returncode == 0 and f"0:{letter['offset']}" in human.stdout and "extraction review" in human.stdout
    shown = memlane(stack, "dlq", "show", TURNS.dlq, str(letter["offset"]))
    assert shown.returncode == 0 and json.loads(shown.stdout)["headers"]["consumer_group"] == h["consumer_group"]
    assert m not in shown.stdout
    assert fact not in await facts(stack, key, "s1")

    ref = f"{letter['partition']}:{letter['offset']}"
    r = memlane(stack, "dlq", "replay", TURNS.dlq, "--offset", ref)
    assert r.returncode == 2 and "--yes" in r.stderr  # not a terminal: nothing is sent unasked
    r = memlane(stack, "dlq", "replay", TURNS.dlq, "--offset", ref, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{ref} -> {settings.topic(TURNS.name)}/" in r.stdout and "replayed 1 of 1" in r.stdout

    async def served():
        return fact in await facts(stack, key, "s1")

    await eventually(served, timeout=60)
    assert len(fake.requests_with(m)) == 2  # the replay's review showed the turn's message again
    [listed] = await of_session(stack, f"{tenant}/{agent}/s1", 1)
    assert listed["replayed"]["count"] == 1 and listed["replayed"]["to"].startswith(settings.topic(TURNS.name))
    assert "replayed -> " in memlane(stack, "dlq", "list", TURNS.dlq).stdout

    # Replayed already: neither naming it again nor --all sends it a second time.
    r = memlane(stack, "dlq", "replay", TURNS.dlq, "--offset", ref, "--yes")
    assert r.returncode == 0 and "replayed already" in r.stdout and "nothing to replay" in r.stdout, r.stdout
    r = memlane(stack, "dlq", "replay", TURNS.dlq, "--all", "--yes")
    assert r.returncode == 0 and "nothing to replay" in r.stdout, r.stdout
    await reviewed_behind(settings, fake, tenant, agent, "s1", 2)
    assert len(fake.requests_with(m)) == 2 and (await facts(stack, key, "s1")).count(fact) == 1


async def test_a_replay_that_fails_again_returns_to_the_dlq_once_as_a_repeat(dstack, fake):
    stack, settings = dstack
    tenant, agent, _ = await new_agent(stack.api_url, settings.operator_key, AgentConfig())
    m = f"mk{uuid.uuid4().hex[:10]}"
    fake.on(m, LATE, LATE, LATE)  # the turn, its replay, and (were it sent) a third time
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn(tenant, agent, "s2", 1, f"My office is in Lyon {m}", "Good to know."))
    session = f"{tenant}/{agent}/s2"
    [first] = await eventually(partial(of_session, stack, session, 1), timeout=60)
    ref = f"{first['partition']}:{first['offset']}"
    r = memlane(stack, "dlq", "replay", TURNS.dlq, "--offset", ref, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr

    both = await eventually(partial(of_session, stack, session, 2), timeout=60)
    repeat = next(x for x in both if x["offset"] != first["offset"])
    assert repeat["repeat"] == 1 and repeat["replayed"] is None
    assert repeat["headers"][REPLAY_OF] == f"{settings.topic(TURNS.dlq)}@{ref}"
    assert repeat["headers"][REPLAY_COUNT] == "1" and repeat["headers"][REPLAY_FOR] == first["headers"]["consumer_group"]
    # Parked by the extraction worker alone: the history and consolidation workers skipped the replay.
    assert repeat["headers"]["consumer_group"] == first["headers"]["consumer_group"]
    assert "repeat 1" in memlane(stack, "dlq", "list", TURNS.dlq).stdout
    # No loop: nothing sends the repeat again on its own.
    await reviewed_behind(settings, fake, tenant, agent, "s2", 2)
    assert len(await of_session(stack, session, 2)) == 2 and len(fake.requests_with(m)) == 2


async def test_the_events_log_is_never_replayed_into(dstack):
    stack, _ = dstack
    r = memlane(stack, "dlq", "replay", "memlane.memory.events.dlq", "--all", "--yes")
    assert r.returncode == 2 and "source of truth" in r.stderr
    r = memlane(stack, "dlq", "list", "memlane.nope")
    assert r.returncode == 2 and "no dead-letter topic" in r.stderr
