"""The client-only package (clients/python, `memlane-client`) against the shared stack, as an
application that installs only it uses it: records in its own model, the blocking client, and the
turn publisher taking plain JSON fields."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

from memlane_client import MemlaneClient, MemlaneError, Record, SyncMemlaneClient, TurnPublisher
from memlane_client.publisher import turn_key

from events import AgentConfig
from events.topics import TURNS
from events.turns import MembershipChanged, Message, SessionEnded, TurnCommitted
from tests.conftest import eventually


async def test_the_async_client_reads_records_in_its_own_model(stack, new_agent):
    _, _, key = await new_agent({"memory": {"tools": ["add_memory", "read_memory"]}})
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        written = await c.add_memory("The release train leaves on Wednesdays", kind="fact")
        record = await c.read_memory(written["memories"][0]["id"])
        assert isinstance(record, Record) and record.summary == "The release train leaves on Wednesdays"
        assert record.scope == "SESSION" and record.provenance.session == "s1"
        found, _ = await c.search_memory("when does the release train leave?")
        assert found[0].record.id == record.id and found[0].score is not None
        try:
            await c.add_memory("x" * 100_000)
        except MemlaneError as e:
            assert (e.status, e.code, e.field) == (422, "VALIDATION_FAILED", "summary")
        else:
            raise AssertionError("a summary over its limit was accepted")


def test_the_blocking_client_makes_the_same_calls(stack, settings):
    with SyncMemlaneClient(stack.api_url, settings.operator_key) as c:
        assert c.whoami()["role"] == "operator"
        assert c.health()["status"] in ("ok", "degraded")


async def test_a_turn_published_as_plain_fields_reaches_session_history(stack, settings, new_agent):
    tenant, agent, key = await new_agent(AgentConfig.model_validate({"history": {"index": "messages"}}))
    turn = {"type": "TurnCommitted", "event_id": "pc-1", "tenant": tenant, "agent": agent, "session": "s9",
            "turn": 1, "execution_id": "x1", "occurred_at": datetime.now(UTC).isoformat(),
            "messages": [{"id": "pm1", "role": "user", "content": "The kiln in studio B runs hot on Fridays"}]}
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn)
    async with MemlaneClient(stack.api_url, key, session="s9") as c:
        async def listed():
            got = await c.message_history()
            return [e["id"] for e in got["events"]] == ["pm1"]

        await eventually(listed, timeout=60)


def test_the_publishers_key_is_the_turns_topics_own():
    at = datetime.now(UTC)
    events = [TurnCommitted(event_id="e", tenant="t", agent="a", session="s", turn=1, execution_id="x", occurred_at=at,
                            messages=[Message(id="m", role="user", content="hi")]),
              SessionEnded(event_id="e2", tenant="t", agent="a", session="s", occurred_at=at),
              MembershipChanged(event_id="e3", tenant="t", agent="a", session="s", joined=True,
                                occurred_at=at)]
    for e in events:
        assert turn_key(e) == TURNS.key_bytes(e) == turn_key(e.model_dump(mode="json")), e.type


def test_the_client_package_imports_without_the_server():
    """Its modules import nothing of memlane's server packages."""
    code = ("import sys, memlane_client, memlane_client.publisher; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('events', 'projections', 'workers', 'services', 'settings')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
