"""`memlane shadow` on the model stack: an agent's recorded turns reviewed again under another
prompt, its decisions set beside live extraction's with the tokens it spent and each policy's score
against the facts expected; live memory is untouched, and a run of the same name goes on where it
stopped instead of asking the model again."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import httpx
import pytest

from events import AgentConfig
from events.topics import COMMANDS, EVENTS, USAGE
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.cli_support import memlane
from tests.e2e.extraction_support import answer, new_agent, read_topic, turn
from tests.e2e.test_consent_extraction import marker
from tests.e2e.test_extraction import cand

CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})


@pytest.fixture(scope="module")
def sstack(model_stack):
    return model_stack


async def ends(settings, agent: str) -> dict[str, int]:
    """How many messages of the agent each of memlane's own topics holds now (other tests share
    the stack, so only the agent's count)."""
    out = {}
    for topic in (COMMANDS, EVENTS, USAGE):
        out[topic.name] = sum(1 for v, _ in await read_topic(settings, topic.name, topic.name)
                              if getattr(v, "agent", None) == agent)
    return out


async def generation(stack) -> dict:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as h:
        return (await h.get("/health")).json()["projection"]["generation"]


async def added(settings, agent: str) -> list | None:
    found = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
             if e.agent == agent and e.type == "RecordAdded"]
    return found or None


async def test_a_shadow_prompt_is_replayed_beside_live_extraction_and_changes_nothing(sstack, fake, tmp_path):
    stack, settings = sstack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    live, shadow = marker(), marker()
    fake.on(live, answer(cand("add", f"Likes green tea {live}", scope="agent")))
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn(tenant, agent, "s1", 1, f"I like green tea, not coffee {live}", "Noted."))
    await eventually(partial(added, settings, agent), timeout=60)
    async with MemlaneClient(stack.api_url, key) as c:
        before = (await c.list_memory())["records"]
    assert [r["summary"] for r in before] == [f"Likes green tea {live}"]

    logs_before, generation_before = await ends(settings, agent), await generation(stack)
    fake.on(shadow, answer(cand("add", f"Dislikes coffee {shadow}", scope="agent")))
    prompt, expected = tmp_path / "prompt.txt", tmp_path / "expected.json"
    prompt.write_text(f"Keep what people dislike, nothing else. {shadow}")
    expected.write_text(json.dumps({"s1/1": [f"Dislikes coffee {shadow}"]}))
    args = ("shadow", "--tenant", tenant, "--agent", agent, "--prompt", str(prompt), "--name", f"try-{agent}",
            "--expected", str(expected))
    r = await asyncio.to_thread(memlane, stack, *args)
    assert r.returncode == 0, r.stderr
    *diffs, last = [json.loads(x) for x in r.stdout.splitlines()]
    assert diffs == [{"turn": "s1/1", "live": {"added": [f"Likes green tea {live}"], "replaced": [], "deleted": []},
                      "shadow": {"added": [f"Dislikes coffee {shadow}"], "replaced": [], "deleted": []}}]
    summary = last["summary"]
    assert (summary["turns"], summary["differing"]) == (1, 1) and summary["shadow_tokens"]["input"] > 0
    assert summary["score"]["shadow"]["recall"] == 1.0 and summary["score"]["live"]["recall"] == 0.0
    asked = len(fake.requests_with(shadow))
    assert asked == 1
    async with MemlaneClient(stack.api_url, key) as c:  # nothing live moved
        assert (await c.list_memory())["records"] == before
    # Nor the log's other topics (usage above all: the shadow's model calls are not the agent's),
    # nor the projections' generation.
    assert await ends(settings, agent) == logs_before and await generation(stack) == generation_before

    # The same name again: the run is finished, so nothing is asked; its report stands.
    again = await asyncio.to_thread(memlane, stack, *args)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == last and len(fake.requests_with(shadow)) == asked
    # Another prompt under that name is refused rather than mixed into its report.
    prompt.write_text("something else")
    other = await asyncio.to_thread(memlane, stack, *args)
    assert other.returncode == 2 and "other parameters" in other.stderr
