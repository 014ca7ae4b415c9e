"""Extraction of a member's facts, end to end: consent, user scope, channels, turn status.

Turns on Kafka -> extraction worker (scripted fake model over HTTP) -> ledger ->
projections; grants and withdrawals go through the ledger as commands. Each test scripts
the fake model under a marker unique to the test, so answers never cross tests.
"""

from __future__ import annotations

import json
import uuid
from functools import partial

import httpx
import pytest

from events import Message, ToolCall
from events.config import EveryMessages, ExtractionConfig, member_facts
from events.record import Scope, Source
from events.rules import extraction_review as review
from events.topics import COMMANDS, EVENTS, USAGE
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually, refused
from tests.e2e.extraction_support import (
    answer,
    new_agent,
    read_topic,
    read_topic_at,
    set_consent,
    turn,
)
from tests.fakes.model_server import Held
from tests.stacks import MODEL_PROFILE
from workers.processors.extraction import processor as extraction

# The model stack's calls: one and its retries (MEMLANE_MODEL_RETRIES), each given up on after
# MEMLANE_MODEL_TIMEOUT_S (1.5 s): a review in flight is held by the fake, not by a long timeout.
ATTEMPTS = 1 + int(MODEL_PROFILE["MEMLANE_MODEL_RETRIES"])


def cand(summary: str, **kw) -> dict:
    return {"decision": "add", "handle": None, "kind": kw.pop("kind", "profile"), "labels": {}, "key": None,
            "scope": kw.pop("scope", "user"), "summary": summary, "content": "",
            "source_message_ids": kw.pop("source_message_ids", []), **kw}


def marker() -> str:
    return f"mk{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def cstack(model_stack):
    return model_stack


@pytest.fixture
async def pub(cstack):
    _, settings = cstack
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as p:
        yield p


async def member_agent(cstack, *users: str) -> tuple[str, str]:
    """A new agent configured as `member_facts()`, and consent granted by `users`."""
    stack, settings = cstack
    tenant, agent, _ = await new_agent(stack.api_url, settings.operator_key, member_facts())
    for user in users:
        await set_consent(settings, tenant, agent, user)
    return tenant, agent


def member_turn(tenant: str, agent: str, session: str, n: int, *texts: str, user: str = "alice",
                channel: str = "studio", **kw) -> object:
    return turn(tenant, agent, session, n, *texts, user=user, channel=channel, **kw)


async def _of(settings, topic: str, agent: str, type_: str, n: int):
    found = [v for v, _ in await read_topic(settings, topic, topic) if v.agent == agent and v.type == type_]
    return found if len(found) >= n else None


async def _search(cstack, tenant: str, agent: str, user: str, query: str) -> list[str]:
    """What the review's similar-memory lookup finds for `user`: the worker's own request."""
    stack, settings = cstack
    item = {"tenant": tenant, "agent": agent, "session": "other", "user": user, "query": query, "limit": 10}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30,
                                 headers={"Authorization": f"Bearer {settings.operator_key}"}) as h:
        r = await h.post("/v1/memory/search/batch", json={"searches": [item], "retrieved": False})
        r.raise_for_status()
    [res] = r.json()["results"]
    assert "records" in res, res
    return [x["summary"] for x in res["records"]]


# ---------------------------------------------------------------------------------- consent


async def test_no_consent_no_review_no_writes_then_a_grant_gives_the_member_user_scope_facts(cstack, fake, pub):
    _, settings = cstack
    tenant, a = await member_agent(cstack)
    said, tool, m2 = marker(), marker(), marker()
    fake.on(said, answer(cand(f"Before consent {said}")))
    fake.on(m2, answer(cand(f"Has a dog called Rex {m2}", source_message_ids=["s1-2-0"])))
    t1 = member_turn(tenant, a, "s1", 1, messages=[
        Message(id="s1-1-0", role="user", content=f"My name is Alice, remember it {said}"),
        Message(id="s1-1-1", role="assistant", content="Hello Alice", tool_calls=[
            ToolCall(id="c1", name="add_memory", arguments={"summary": f"Tool write {tool}", "kind": "profile"})])])
    await pub.publish(t1)
    [skip] = await eventually(partial(_of, settings, USAGE.name, a, "MemorySkipped", 1), timeout=40)
    assert (skip.reason, skip.user, skip.turn, skip.session) == ("consent_required", "alice", 1, "s1")
    assert "CONSENT_REQUIRED" in skip.detail
    assert fake.requests_with(said) == []  # no review
    # The outcome went out in the same transaction as the usage record; the tool write did not.
    cmds = [c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name) if c.agent == a]
    assert [c.type for c in cmds if c.type not in ("ConfigureAgent", "GrantConsent")] == ["TurnOutcome"]

    await set_consent(settings, tenant, a, "alice")
    await pub.publish(member_turn(tenant, a, "s1", 2, f"My dog is called Rex {m2}", "Nice."))
    [added] = await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 1), timeout=40)
    r = added.record
    assert (r.summary, r.scope, r.user, r.provenance.user, r.provenance.source) == (
        f"Has a dog called Rex {m2}", Scope.USER, "alice", "alice", Source.EXTRACTION)
    [req] = fake.requests_with(m2)
    # The model is told the scopes it may write, and the refused turn's messages never reach a review.
    assert '"scope" is one of:\nuser.' in req["messages"][0]["content"]
    assert said not in json.dumps(req) and "s1-1-0" not in json.dumps(req)
    assert [e.record.summary for e in await _of(settings, EVENTS.name, a, "RecordAdded", 1)] == [r.summary]


async def test_two_members_of_one_agent_never_see_each_others_facts(cstack, fake, pub):
    _, settings = cstack
    tenant, a = await member_agent(cstack, "alice", "bob")
    ma, mb, ma2 = marker(), marker(), marker()
    fact = f"Owns a parrot named Kiwi {ma}"
    fake.on(ma, answer(cand(fact)))
    await pub.publish(member_turn(tenant, a, "sa", 1, f"I own a parrot named Kiwi {ma}", "Lovely."))
    await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 1), timeout=40)
    query = f"my parrot named Kiwi {ma}"

    async def searchable():
        return fact in await _search(cstack, tenant, a, "alice", query)

    await eventually(searchable, timeout=40)
    assert await _search(cstack, tenant, a, "bob", query) == []
    fake.on(mb, answer())
    fake.on(ma2, answer())
    await pub.publish(member_turn(tenant, a, "sb", 1, f"I also own a parrot named Kiwi {ma} {mb}", "Nice.", user="bob"))
    # Another session of alice's: her facts follow her across sessions.
    await pub.publish(member_turn(tenant, a, "sa2", 1, f"Tell me about my parrot named Kiwi {ma} {ma2}", "Sure."))
    [bob_req] = await eventually(lambda: fake.requests_with(mb), timeout=40)
    [alice_req] = await eventually(lambda: fake.requests_with(ma2), timeout=40)
    bob_prompt, alice_prompt = bob_req["messages"][1]["content"], alice_req["messages"][1]["content"]
    assert fact not in bob_prompt and bob_prompt.startswith("Existing memories (refer to them by handle):\n(none)")
    assert f"[1] (profile, user) {fact}" in alice_prompt


# ---------------------------------------------------------------------------------- channels, status


async def test_a_turn_in_a_channel_without_memory_or_that_did_not_complete_is_not_reviewed(cstack, fake, pub):
    _, settings = cstack
    tenant, a = await member_agent(cstack, "alice")
    slack_said, slack_tool, failed_said, failed_tool, barrier = (marker() for _ in range(5))
    for m in (slack_said, failed_said, barrier):
        fake.on(m, answer(cand(f"Reviewed {m}")))

    def with_tool(n: int, said: str, tool: str, **kw):
        return member_turn(tenant, a, "s1", n, messages=[
            Message(id=f"s1-{n}-0", role="user", content=f"Please remember this {said}"),
            Message(id=f"s1-{n}-1", role="assistant", content="Done", tool_calls=[
                ToolCall(id=f"c{n}", name="add_memory", arguments={"summary": f"Tool write {tool}", "kind": "profile"})])],
            **kw)

    await pub.publish(with_tool(1, slack_said, slack_tool, channel="slack"))
    await pub.publish(with_tool(2, failed_said, failed_tool, status="failed"))
    await pub.publish(member_turn(tenant, a, "s1", 3, f"Remember {barrier}", "ok"))
    skips = await eventually(partial(_of, settings, USAGE.name, a, "MemorySkipped", 2), timeout=40)
    assert sorted((s.turn, s.reason) for s in skips) == [(1, "channel_not_allowed"), (2, "turn_not_completed")]
    added = await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 2), timeout=40)
    # The failed turn's own tool call is still applied (the agent made it); the slack turn's is not.
    assert sorted((e.record.summary, e.record.provenance.source, e.record.user) for e in added) == sorted([
        (f"Tool write {failed_tool}", Source.TOOL, "alice"), (f"Reviewed {barrier}", Source.EXTRACTION, "alice")])
    # Neither turn was reviewed, and neither's messages joined the next turn's window.
    assert fake.requests_with(slack_said) == [] and fake.requests_with(failed_said) == []
    [req] = fake.requests_with(barrier)
    assert "s1-1-0" not in req["messages"][1]["content"] and "s1-2-0" not in req["messages"][1]["content"]
    cmds = [c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name) if c.agent == a]
    assert not [c for c in cmds if c.type == "AddMemory" and slack_tool in c.summary]


# ---------------------------------------------------------------------------------- withdrawal in flight


async def test_a_withdrawal_during_a_review_in_flight_lets_nothing_be_written_after_it(cstack, fake, pub):
    _, settings = cstack
    tenant, a = await member_agent(cstack, "alice")
    m0, m = marker(), marker()
    fake.on(m0, answer(cand(f"Lives in Lisbon {m0}")))
    await pub.publish(member_turn(tenant, a, "s1", 1, f"I live in Lisbon {m0}", "Noted."))
    [kept] = await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 1), timeout=40)

    held = Held()  # every call of the review waits until the withdrawal has landed
    route = fake.on(m, *[held.answer] * ATTEMPTS)
    t = member_turn(tenant, a, "s1", 2, messages=[
        Message(id="s1-2-0", role="user", content=f"I work at Acme and I like jazz {m}"),
        Message(id="s1-2-1", role="assistant", content="Noted", tool_calls=[
            ToolCall(id="c9", name="add_memory", arguments={"summary": f"Tool write in flight {m}", "kind": "profile"})])])
    proposals = {review.command_id(t, 0), review.command_id(t, 1)}
    tool_write = extraction.command_id(t.event_id, "c9")
    try:
        await pub.publish(t)
        await eventually(lambda: route.hits >= 1, timeout=60)  # the review is waiting on the model
        await set_consent(settings, tenant, a, "alice", grant=False)
        # Still the one review, unanswered: a call the client gave up on is retried, ATTEMPTS at most.
        assert 1 <= route.hits <= ATTEMPTS
    finally:
        held.release(answer(cand(f"Works at Acme {m}"), cand(f"Likes jazz {m}")))

    async def settled():
        # The turn is resolved and both proposals answered: the review finished after the withdrawal.
        evs = [(p, o, e) for p, o, e, _ in await read_topic_at(settings, EVENTS.name, EVENTS.name) if e.agent == a]
        answered = {e.command_id for _, _, e in evs if e.type == "CommandRejected"} | {
            e.command_id for _, _, e in evs if e.type == "RecordAdded"}
        resolved = sum(1 for _, _, e in evs if e.type == "TurnResolved")
        return evs if proposals <= answered and resolved >= 2 else None

    evs = await eventually(settled, timeout=60)
    [(wp, wo, withdrawn)] = [(p, o, e) for p, o, e in evs if e.type == "ConsentWithdrawn"]
    assert withdrawn.user == "alice"
    # An agent's events share one partition: what follows the withdrawal's offset wrote nothing.
    after = [e for p, o, e in evs if p == wp and o > wo]
    assert {e.type for e in after} <= {"CommandRejected", "TurnResolved"}, [e.type for e in after]
    rejected = {e.command_id: e for e in after if e.type == "CommandRejected"}
    assert proposals <= set(rejected)
    assert all((rejected[c].code, rejected[c].field) == ("CONSENT_REQUIRED", "user") for c in proposals)
    # The staged tool write was checked when the outcome applied it, after the withdrawal.
    assert not [e for p, o, e in evs if e.type == "RecordAdded" and e.command_id == tool_write]
    # The proposals were made and sent (the review was not just dropped), and the member's
    # facts are as they were: the withdrawal deleted nothing.
    cmds = {c.command_id: c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name) if c.agent == a}
    assert proposals <= set(cmds) and all(cmds[c].user == "alice" for c in proposals)
    assert [e.record.id for p, o, e in evs if e.type.startswith("Record")] == [kept.record.id]


# ---------------------------------------------------------------------------------- cited messages


async def test_a_message_a_found_fact_already_cites_is_not_shown_to_the_review(cstack, fake, pub):
    stack, settings = cstack
    tenant, a = await member_agent(cstack, "alice")
    cfg = member_facts(extraction=ExtractionConfig(every=EveryMessages(messages=3)))
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=a) as op:
        await op.configure(cfg)
        await eventually(partial(_configured, op, cfg), timeout=30)
    m = marker()
    fake.on(m, answer())
    # Turn 1 (two messages, not due yet): the agent saves a fact from its own message.
    await pub.publish(member_turn(tenant, a, "s1", 1, messages=[
        Message(id="s1-1-0", role="user", content=f"Hello there, I am back {m}"),
        Message(id="s1-1-1", role="assistant", content=f"I saved that your warehouse code is W{m}", tool_calls=[
            ToolCall(id="c1", name="add_memory", arguments={"summary": f"Warehouse code is W{m}", "kind": "profile"})])]))

    async def searchable():
        return f"Warehouse code is W{m}" in await _search(cstack, tenant, a, "alice", f"your warehouse code is W{m}")

    await eventually(searchable, timeout=40)
    # Turn 2 makes three: the review's window would be s1-1-0, s1-1-1 and s1-2-0.
    await pub.publish(member_turn(tenant, a, "s1", 2, f"Thanks for keeping my warehouse code {m}"))
    [req] = await eventually(lambda: fake.requests_with(m), timeout=40)
    shown = req["messages"][1]["content"]
    assert f"[1] (profile, user) Warehouse code is W{m}" in shown  # the fact was found ...
    assert 'id="s1-1-1"' not in shown  # ... so the message it cites is not asked about again
    assert 'id="s1-1-0"' in shown and 'id="s1-2-0"' in shown


async def _configured(op, cfg) -> bool:
    return await op.config() == cfg


# ---------------------------------------------------------------------------------- without a model


async def test_without_a_model_tool_writes_of_a_member_without_consent_are_not_forwarded(stack, settings, publisher):
    # The default stack has no model configured: no reviews, only the agent's own tool writes.
    tenant, a, _ = await new_agent(stack.api_url, settings.operator_key, member_facts())
    m = marker()

    def tool_turn(n: int, user: str):
        return member_turn(tenant, a, "s1", n, user=user, messages=[
            Message(id=f"s1-{n}-0", role="user", content="Remember my plan"),
            Message(id=f"s1-{n}-1", role="assistant", content="Saved", tool_calls=[
                ToolCall(id=f"c{n}", name="add_memory", arguments={"summary": f"Plan of {user} {m}", "kind": "profile"})])])

    await set_consent(settings, tenant, a, "alice")
    await publisher.publish(tool_turn(1, "bob"))  # bob never granted consent
    await publisher.publish(tool_turn(2, "alice"))
    [added] = await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 1), timeout=40)
    assert (added.record.summary, added.record.user, added.record.scope) == (f"Plan of alice {m}", "alice", Scope.USER)
    [skip] = await eventually(partial(_of, settings, USAGE.name, a, "MemorySkipped", 1), timeout=40)
    assert (skip.reason, skip.user, skip.turn) == ("consent_required", "bob", 1)
    cmds = [c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name) if c.agent == a]
    assert [c.user for c in cmds if c.type == "AddMemory"] == ["alice"]
    assert sum(1 for c in cmds if c.type == "TurnOutcome") == 2  # both turns' outcomes still reach the ledger


# ---------------------------------------------------------------------------------- consolidation


async def test_a_members_ended_session_is_consolidated_into_their_own_memory_only_with_consent(cstack, fake, pub):
    from datetime import UTC, datetime

    from events import SessionEnded
    from tests.e2e.test_extraction import consolidation

    stack, settings = cstack
    cfg = member_facts(extraction=ExtractionConfig(every=EveryMessages(messages=100)))  # no reviews: only consolidation
    tenant, a, _ = await new_agent(stack.api_url, settings.operator_key, cfg)
    await set_consent(settings, tenant, a, "alice")
    before, after = marker(), marker()
    fake.on(before, consolidation(before))
    fake.on(after, consolidation(after))

    def ended(session: str, user: str) -> SessionEnded:
        return SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=a, session=session, user=user,
                            channel="studio", outcome="successful", occurred_at=datetime.now(UTC))

    # Bob never granted consent: his session is not consolidated, and the usage record says why.
    await pub.publish(member_turn(tenant, a, "s-bob", 1, f"{before}: restore staging", "Done.", user="bob"))
    await pub.publish(ended("s-bob", "bob"))
    skips = await eventually(partial(_of, settings, USAGE.name, a, "MemorySkipped", 2), timeout=40)
    [skip] = [s for s in skips if s.detail.startswith("consolidation")]  # the other is his turn's, extraction's
    assert (skip.reason, skip.user, skip.session) == ("consent_required", "bob", "s-bob")
    assert fake.requests_with(before) == []
    # Alice did: her episode is hers (USER scope), not the agent's, so Bob never reads it.
    await pub.publish(member_turn(tenant, a, "s-alice", 1, f"{after}: restore staging", "Done."))
    await pub.publish(ended("s-alice", "alice"))
    [added] = await eventually(partial(_of, settings, EVENTS.name, a, "RecordAdded", 1), timeout=40)
    r = added.record
    assert (r.kind, r.scope, r.user, r.provenance.source) == ("episode", Scope.USER, "alice", Source.CONSOLIDATION)
    await set_consent(settings, tenant, a, "bob")
    assert await _search(cstack, tenant, a, "bob", "restore staging") == []
    assert r.summary in await _search(cstack, tenant, a, "alice", "restore staging")


# ---------------------------------------------------------------------------------- erasure


async def test_a_members_erasure_takes_every_record_made_from_their_turns_whatever_its_scope(cstack, fake, pub):
    """Extraction's session and agent facts, a tool write, the episode of their session and an
    agent key's write naming them: all sealed under the member's key, never shown to the
    operator, and gone with the erasure (unreadable in the log too). Another member's stay."""
    from datetime import UTC, datetime

    from events import AgentConfig, SessionEnded
    from events.config import MemoryConfig, ScopeConfig
    from tests.e2e.test_extraction import consolidation

    stack, settings = cstack
    cfg = AgentConfig(memory=MemoryConfig(kinds=["fact"], tools=["add_memory"],
                                          scope=ScopeConfig(read=["session", "agent"], write=["session", "agent"])))
    tenant, a, key = await new_agent(stack.api_url, settings.operator_key, cfg)
    m, b = marker(), marker()
    canary = {name: f"{name} {marker()}" for name in ("session fact", "agent fact", "tool write", "episode", "api write")}
    fake.on(m, answer(cand(canary["session fact"], kind="fact", scope="session"),
                      cand(canary["agent fact"], kind="fact", scope="agent")),
            consolidation(m, summary=canary["episode"]))
    fake.on(b, answer(cand(f"Bob's agent fact {b}", kind="fact", scope="agent")))
    await pub.publish(turn(tenant, a, "s-a", 1, messages=[
        Message(id="s-a-1-0", role="user", content=f"Please note this down {m}"),
        Message(id="s-a-1-1", role="assistant", content="Done", tool_calls=[
            ToolCall(id="c1", name="add_memory", arguments={"summary": canary["tool write"], "kind": "fact"})])],
        user="alice"))
    await eventually(lambda: fake.requests_with(m) or None, timeout=40)  # reviewed before the session ends
    await pub.publish(SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=a, session="s-a", user="alice",
                                   execution_id="exec-s-a", outcome="successful", occurred_at=datetime.now(UTC)))
    await pub.publish(turn(tenant, a, "s-b", 1, f"Note mine too {b}", "Done.", user="bob"))
    async with MemlaneClient(stack.api_url, key, session="s-a", user="alice") as alice_agent:
        await alice_agent.add_memory(canary["api write"], scope="SESSION")

    async def summaries(session: str = "s-a") -> list[str]:
        async with MemlaneClient(stack.api_url, key, session=session) as c:
            found, _ = await c.search_memory(None, limit=50)
        return [f.record.summary for f in found]

    async def all_there():
        got = await summaries()
        return got if all(c in got for c in canary.values()) and f"Bob's agent fact {b}" in got else None

    await eventually(all_there, timeout=60)
    events = [v for v, _ in await read_topic(settings, EVENTS.name, EVENTS.name) if v.agent == a and v.type == "RecordAdded"]
    by_summary = {e.record.summary: e.record for e in events}
    assert {by_summary[c].scope for c in canary.values()} == {Scope.SESSION, Scope.AGENT}
    assert all(by_summary[c].user == "alice" for c in canary.values())
    raw = b"".join(v for v, _ in await read_topic(settings, EVENTS.name) if isinstance(v, bytes))
    assert not any(c.encode() in raw for c in canary.values())  # sealed, in every scope

    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=a) as op:
        # The operator never reads a member's data: not listed, not found, not read by id.
        listing = json.dumps(await op.list_memory(first=100))
        assert not any(c in listing for c in canary.values()) and f"Bob's agent fact {b}" not in listing
        found, _ = await op.search_memory("note this down", limit=50)
        assert not any(f.record.summary in canary.values() for f in found)
        await refused(op.read_memory(by_summary[canary["agent fact"]].id), 404, "NOT_FOUND", "id")
        assert (await op.erase_subject("alice"))["status"] == "applied"

    async def gone():
        got = await summaries()
        return got if not any(c in got for c in canary.values()) else None

    left = await eventually(gone, timeout=60)
    assert f"Bob's agent fact {b}" in left  # bob's, made from his turn, stays
    assert await summaries("s-b") == [f"Bob's agent fact {b}"]
    # In the log, what was sealed under alice's keys no longer opens, once the ledger has
    # destroyed them (it follows the erasure's commit).
    async def unreadable():
        kept = [v.record.summary for v, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
                if v.agent == a and v.type == "RecordAdded"]
        return kept == [f"Bob's agent fact {b}"] or None

    await eventually(unreadable, timeout=60)
