"""The near-duplicate merge through Kafka: a paraphrase written through the API merges into the
first record (merged: true, its id), a different fact with the same words is a second record,
and the merge and its evidence are in the event log, so a rebuild folds the same."""

from __future__ import annotations

import pytest

from events.commands import AddMemory
from events.config import AgentConfig
from events.memory import RecordAdded
from events.rules.ledger import LedgerState, decide, evolve
from events.topics import COMMANDS, EVENTS
from services.client import MemlaneClient
from tests.e2e.extraction_support import new_agent, read_topic


@pytest.fixture(scope="module")
def ndstack(stack, settings):
    return stack, settings

async def test_a_paraphrase_merges_and_a_different_fact_is_stored(ndstack):
    stack, settings = ndstack
    config = AgentConfig.model_validate({"memory": {"scope": {"read": ["session", "agent"],
                                                              "write": ["session", "agent"]}}})
    _, agent, key = await new_agent(stack.api_url, settings.operator_key, config)
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        first = await c.add_memory("The user prefers short answers", scope="AGENT")
        again = await c.add_memory("User prefers brief answers.", scope="AGENT")
        assert again.get("merged") is True and again["id"] == first["id"], again
        other = await c.add_memory("The user prefers long answers", scope="AGENT")
        assert not other.get("merged") and other["id"] != first["id"]
        listed = {f.record.id for f in (await c.search_memory(None))[0]}
        assert listed == {first["id"], other["id"]}
        hits = [h.record.id for h in (await c.search_memory("brief answers"))[0]]
        assert hits.count(first["id"]) == 1 and len(hits) == 2
    # The decision and its inputs are in the log: a rebuild folds the merge as it happened.
    added = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
             if isinstance(e, RecordAdded) and e.agent == agent]
    merges = [e for e in added if e.merged]
    assert [e.record.id for e in merges] == [first["id"]]
    assert merges[0].merge is not None and merges[0].merge.record_id == first["id"]
    assert merges[0].merge.similarity >= 0.82
    assert len({e.record.id for e in added}) == 2
    # Replay: the ledger's state folded from the log before the merge decides the logged
    # command (evidence included) into the same events.
    commands = [c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name)
                if isinstance(c, AddMemory) and c.agent == agent and c.merge is not None]
    [cmd] = [c for c in commands if c.command_id == merges[0].command_id]
    events = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name) if getattr(e, "agent", None) == agent]
    state = LedgerState()
    for e in events[:events.index(merges[0])]:
        evolve(state, e)
    replayed = decide(state, cmd)
    assert [(e.type, e.record.id, e.merged, e.merge) for e in replayed] == [
        ("RecordAdded", first["id"], True, merges[0].merge)]
