"""Notes end to end (docs/features/notes.md): turns through Kafka into history,
notes through the API and the ledger into the note view, and recall's "Notes" layer.

One agent's fixture conversation: a 1:1 session `s1` (two turns of no member, one of member fay),
another session `s2`, and a group session `g1` with no membership change recorded yet.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events import AgentConfig, Message
from events.config import HistoryConfig
from events.rules.history import encode_cursor, fingerprint
from events.turns import MembershipChanged, MessageDeleted
from services.client import MemlaneClient, MemlaneError, TurnPublisher
from tests.conftest import eventually, refused
from tests.e2e.rebuild_support import rebuilt_redis
from tests.e2e.test_history import turn
from tests.redis_at import redis_at

T = datetime(2026, 9, 21, 9, 0, tzinfo=UTC)


def fixture_turns(tenant, agent):
    m = Message
    return [
        turn(tenant, agent, 1, [m(id="u1", role="user", content="The kestrel release goes out on Tuesdays"),
                                m(id="a1", role="assistant", content="Noted: kestrel ships on Tuesdays")],
             session="s1", at=T),
        turn(tenant, agent, 2, [m(id="u2", role="user", content="The reviewer must approve the kestrel changelog")],
             session="s1", at=T + timedelta(minutes=1)),
        turn(tenant, agent, 3, [m(id="f1", role="user", content="fay: my cards are the ace and the king")],
             session="s1", at=T + timedelta(minutes=2)).model_copy(update={"user": "fay"}),
        turn(tenant, agent, 1, [m(id="v1", role="user", content="The kestrel budget is 4200 euros")],
             session="s2", at=T + timedelta(minutes=3)),
        turn(tenant, agent, 1, [m(id="w1", role="user", content="The walrus plan starts in March")],
             session="g1", at=T + timedelta(minutes=4)),
    ]


async def _agent(stack, settings, across: bool = True):
    """A fresh agent with history (across conversations as asked) and the fixture turns readable."""
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    cfg = AgentConfig(history=HistoryConfig(across_conversations=across))
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        await op.configure(cfg)
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for ev in fixture_turns(tenant, agent):
            await pub.publish(ev)
    for session, last, user in (("s1", "u2", None), ("s1", "f1", "fay"), ("s2", "v1", None), ("g1", "w1", None)):
        async with MemlaneClient(stack.api_url, key, session=session, user=user) as c:
            async def readable(c=c, last=last) -> bool:
                return [e["id"] for e in (await c.search_history(ids=[last]))["events"]] == [last]

            await eventually(readable, timeout=60)
    return tenant, agent, key


@pytest.fixture(scope="module")
async def agent(stack, settings):
    return await _agent(stack, settings)


def client(stack, key, session="s1", **kw) -> MemlaneClient:
    return MemlaneClient(stack.api_url, key, session=session, **kw)


def note_ids(recalled) -> list[str]:
    return [n["id"] for n in recalled["notes"]]


# ------------------------------------------------------------------ save, revise, read, forget


async def test_a_note_is_made_revised_and_a_stale_revision_changes_nothing(stack, agent):
    tenant, agent_id, key = agent
    async with client(stack, key) as c:
        made = await c.save_note("release-rules", "Release rules", "Releases go out on Tuesdays", ["u1"])
        assert made["status"] == "applied" and made["note"]["revision"] == 1
        assert made["note"]["source_messages"] == [{"conversation": "s1", "id": "u1"}]
        e = await refused(c.save_note("release-rules", "Release rules", "overwrite", ["u1"], 0), 409,
                          "REVISION_CONFLICT", "expected_revision")
        assert "revision 1" in e.message
        revised = await c.save_note("release-rules", "Release rules",
                                    "Releases go out on Tuesdays; the reviewer must approve the changelog",
                                    ["u1", "u2"], expected_revision=1)
        assert revised["note"]["revision"] == 2
        e = await refused(c.save_note("release-rules", "Release rules", "stale", ["u1"], 1), 409, "REVISION_CONFLICT",
                          "expected_revision")
        assert "revision 2" in e.message
        read = await c.read_note("release-rules")
        assert (read["revision"], read["hidden"]) == (2, False)
        assert read["summary"] == "Releases go out on Tuesdays; the reviewer must approve the changelog"
        # memory_read gives the sources' text, as history keeps it.
        assert [(s["conversation"], s["id"]) for s in read["source_messages"]] == [("s1", "u1"), ("s1", "u2")]
        assert "goes out on Tuesdays" in read["source_messages"][0]["text"]
        found = await c.search_notes("when do releases go out?")
        assert [n["id"] for n in found["notes"]] == ["release-rules"] and found["notes"][0]["sources"] == 2
        # memory_search with kind "notes", on the history search: the same notes.
        assert (await c.search_history("when do releases go out?", kind="notes"))["notes"] == found["notes"]
        # A cursor re-made with a negative offset is refused (it once spun the server forever).
        forged = encode_cursor(-1, fingerprint("notes", tenant, agent_id, None, "releases"))
        await refused(c.search_notes("releases", cursor=forged), 422, "VALIDATION_FAILED", "cursor")


async def test_a_note_citing_a_message_the_caller_cannot_see_is_refused_naming_the_source(stack, settings, agent):
    _, _, key = agent
    async with client(stack, key) as c:
        await refused(c.save_note("n1", "t", "s", ["u1", "nope"]), 422, "VALIDATION_FAILED", "source_messages.1")
        # fay's message is hers: the agent speaking for no member (or another member) cannot cite it.
        await refused(c.save_note("n1", "t", "s", ["f1"]), 422, "VALIDATION_FAILED", "source_messages.0")
        await refused(c.read_note("n1"), 404, "NOT_FOUND")
    async with client(stack, key, user="bob") as c:
        await refused(c.save_note("n1", "t", "s", ["u1", "f1"]), 422, "VALIDATION_FAILED", "source_messages.1")
    async with client(stack, key, user="fay") as c:
        made = await c.save_note("fay-cards", "Fay's cards", "Fay holds the ace and the king", ["f1"])
        assert made["note"]["revision"] == 1
    # Another agent's messages are not this one's, whatever their ids: a fresh agent with no turns.
    tenant, _, _ = agent
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent="empty-agent") as op:
        empty = await op.issue_key(tenant, "empty-agent")
        await op.configure(AgentConfig(history=HistoryConfig(across_conversations=True)))
    async with client(stack, empty) as c:
        await refused(c.save_note("n1", "t", "s", ["u1", {"conversation": "s2", "id": "v1"}]), 422,
                      "VALIDATION_FAILED", "source_messages.0")


async def test_a_bad_id_or_body_is_refused_naming_the_field(stack, agent):
    _, _, key = agent
    async with client(stack, key) as c:
        await refused(c.save_note("a b", "t", "s", ["u1"]), 422, "VALIDATION_FAILED", "note_id")
        await refused(c.save_note("ok", "t" * 201, "s", ["u1"]), 422, "VALIDATION_FAILED", "topic")
        await refused(c.save_note("ok", "t", "s" * 2001, ["u1"]), 422, "VALIDATION_FAILED", "summary")
        await refused(c.save_note("ok", "t", "s", [f"m{i}" for i in range(33)]), 422, "VALIDATION_FAILED",
                      "source_messages")
        await refused(c.save_note("ok", "t", "s", []), 422, "VALIDATION_FAILED", "source_messages")
    async with MemlaneClient(stack.api_url, key) as c:  # no X-Session: a bare message id names nothing
        await refused(c.save_note("ok", "t", "s", ["u1"]), 422, "VALIDATION_FAILED", "source_messages.0")


async def test_forget_deletes_the_note_and_the_messages_stay(stack, agent):
    _, _, key = agent
    async with client(stack, key) as c:
        await c.save_note("budget", "Kestrel budget", "The kestrel budget is 4200 euros",
                          [{"conversation": "s2", "id": "v1"}, "u1"])
        assert "budget" in note_ids(await c.recall("conv-forget", "what is the kestrel budget?"))
        await refused(c.forget_note("budget", expected_revision=2), 409, "REVISION_CONFLICT")
        gone = await c.forget_note("budget", expected_revision=1)
        assert gone["forgotten"] and gone["revision"] == 1
        await refused(c.read_note("budget"), 404, "NOT_FOUND")
        await refused(c.forget_note("budget"), 404, "NOT_FOUND")
        assert "budget" not in note_ids(await c.recall("conv-forget", "what is the kestrel budget?"))
        assert [e["id"] for e in (await c.search_history(ids=["u1"]))["events"]] == ["u1"]
    async with client(stack, key, session="s2") as c:
        assert [e["id"] for e in (await c.search_history(ids=["v1"]))["events"]] == ["v1"]


# ------------------------------------------------------------------ recall re-checks the sources


async def test_recall_shows_the_note_and_drops_it_once_a_source_is_no_longer_visible(stack, settings, agent):
    tenant, agent_id, key = agent
    async with client(stack, key, session="g1") as c:
        await c.save_note("walrus", "Walrus plan", "The walrus plan starts in March", ["w1"])
        recalled = await c.recall("conv-walrus", "when does the walrus plan start?")
        notes = [n for n in recalled["notes"] if n["id"] == "walrus"]
        assert notes == [{"id": "walrus", "title": "Walrus plan", "text": "The walrus plan starts in March",
                          "revision": 1, "sources": 1}]
        assert "Walrus plan: The walrus plan starts in March (id: walrus)" in recalled["rendered"]
        # The platform reports that the agent joined the group only after w1 was said: w1 is no
        # longer a message it could see, so the note is not returned any more.
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
            await pub.publish(MembershipChanged(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent_id,
                                                session="g1", joined=True, occurred_at=T + timedelta(hours=1)))

        async def dropped() -> bool:
            return "walrus" not in note_ids(await c.recall("conv-walrus", "when does the walrus plan start?"))

        await eventually(dropped, timeout=30)
        read = await c.read_note("walrus")
        assert read["hidden"] and "summary" not in read and "topic" not in read
        assert read["source_messages"] == [{"conversation": "g1", "id": "w1", "visible": False}]
        assert (await c.search_notes("walrus"))["notes"] == []
        # Nor can a new note cite it.
        await refused(c.save_note("walrus-2", "Walrus plan", "March", ["w1"]), 422, "VALIDATION_FAILED",
                      "source_messages.0")
        # The agent can still revise it with sources it can see, or forget it.
        assert (await c.forget_note("walrus", expected_revision=1))["forgotten"]


async def test_a_deleted_message_is_found_no_more_and_a_note_citing_it_is_left_out(stack, settings):
    """A fresh agent of its own: the platform deletes a message of the shared fixture's."""
    tenant, agent_id, key = await _agent(stack, settings)
    async with client(stack, key) as c:
        await c.save_note("review", "Review rule", "The reviewer approves the changelog", ["u2"])
        await c.save_note("release", "Release day", "Kestrel ships on Tuesdays", ["u1"])

        async def found() -> list[str]:
            return [e["id"] for e in (await c.search_history("reviewer approve changelog", mode="lexical"))["events"]]

        assert "u2" in await found()
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
            await pub.publish(MessageDeleted(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent_id, session="s1",
                                             message_id="u2", occurred_at=T + timedelta(hours=1)))

        async def gone() -> bool:
            return (await c.read_note("review"))["hidden"] and "u2" not in await found()

        await eventually(gone, timeout=30)
        assert [e["id"] for e in (await c.search_history(ids=["u2", "u1"]))["events"]] == ["u1"]
        assert [n["id"] for n in (await c.search_notes("kestrel reviewer changelog"))["notes"]] == ["release"]
        assert not (await c.read_note("release"))["hidden"]


async def test_switching_history_across_conversations_off_hides_notes_citing_other_sessions(stack, settings):
    tenant, agent_id, key = await _agent(stack, settings, across=True)
    async with client(stack, key) as c:
        await c.save_note("budget", "Kestrel budget", "The kestrel budget is 4200 euros",
                          [{"conversation": "s2", "id": "v1"}])
        await c.save_note("release", "Kestrel release", "The kestrel release goes out on Tuesdays", ["u1"])
        assert set(note_ids(await c.recall("conv", "kestrel budget and release"))) == {"budget", "release"}
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent_id) as op:
            await op.configure(AgentConfig(history=HistoryConfig(across_conversations=False)))

        async def hidden() -> bool:
            return note_ids(await c.recall("conv", "kestrel budget and release")) == ["release"]

        await eventually(hidden, timeout=30)
        assert (await c.read_note("budget"))["hidden"]
        await refused(c.save_note("again", "t", "s", [{"conversation": "s2", "id": "v1"}]), 422,
                      "VALIDATION_FAILED", "source_messages.0")


# ------------------------------------------------------------------ isolation


async def test_a_note_reaches_only_its_own_identity(stack, settings, agent):
    tenant, agent_id, key = agent
    async with client(stack, key) as c:
        await c.save_note("iso-agent", "Changelog review", "The reviewer approves the kestrel changelog", ["u2"])
    async with client(stack, key, user="fay") as c:
        await c.save_note("iso-fay", "Fay's changelog", "Fay reads the kestrel changelog", ["f1", "u2"])
        assert "iso-fay" in note_ids(await c.recall("c", "kestrel changelog"))
        assert "iso-agent" not in note_ids(await c.recall("c", "kestrel changelog"))  # the agent's own, not fay's
        await refused(c.read_note("iso-agent"), 404, "NOT_FOUND")
    async with client(stack, key) as c:
        assert "iso-fay" not in note_ids(await c.recall("c", "kestrel changelog"))
        await refused(c.read_note("iso-fay"), 404, "NOT_FOUND")
        assert all(n["id"] != "iso-fay" for n in (await c.search_notes("kestrel changelog"))["notes"])
    async with client(stack, key, user="bob") as c:  # another member of the same agent
        await refused(c.read_note("iso-fay"), 404, "NOT_FOUND")
        assert not note_ids(await c.recall("c", "kestrel changelog"))
        assert (await c.search_notes())["notes"] == []
        await refused(c.forget_note("iso-fay"), 404, "NOT_FOUND")
    _, _, other_key = await _agent(stack, settings)
    async with client(stack, other_key) as c:  # another agent, the same ids
        await refused(c.read_note("iso-agent"), 404, "NOT_FOUND")
        assert "iso-agent" not in note_ids(await c.recall("c", "kestrel changelog"))
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent_id) as op:
        admin = await op.issue_key(tenant, agent_id, "operator")
        member = await op.issue_key(tenant, agent_id, "member", user="fay")
    for k, user in ((admin, None), (admin, "fay"), (settings.operator_key, None)):
        async with MemlaneClient(stack.api_url, k, session="s1", tenant=tenant, agent=agent_id, user=user) as c:
            await refused(c.read_note("iso-agent"), 403, "FORBIDDEN")
            await refused(c.search_notes(), 403, "FORBIDDEN")
            await refused(c.forget_note("iso-agent"), 403, "FORBIDDEN")
            await refused(c.save_note("op", "t", "s", ["u1"]), 403, "FORBIDDEN")
            recalled = await c.recall("c", "kestrel changelog")
            assert recalled["notes"] == [] and "changelog" not in recalled["rendered"].lower()
    async with MemlaneClient(stack.api_url, member, session="s1") as c:
        await refused(c.read_note("iso-fay"), 403, "FORBIDDEN")
        await refused(c.search_notes(), 403, "FORBIDDEN")


async def test_a_members_erasure_removes_their_notes_and_nothing_else(stack, settings):
    tenant, agent_id, key = await _agent(stack, settings)
    async with client(stack, key, user="fay") as c:
        await c.save_note("fay-cards", "Fay's cards", "Fay holds the ace and the king", ["f1"])
    async with client(stack, key) as c:
        await c.save_note("release", "Kestrel release", "The kestrel release goes out on Tuesdays", ["u1"])
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent_id) as op:
        await op.erase_subject("fay")
    async with client(stack, key, user="fay") as c:
        async def gone() -> bool:
            try:
                await c.read_note("fay-cards")
            except MemlaneError as e:
                return e.code == "NOT_FOUND"
            return False

        await eventually(gone, timeout=30)
    async with client(stack, key) as c:
        assert (await c.read_note("release"))["revision"] == 1


# ------------------------------------------------------------------ rebuild


async def test_a_rebuild_gives_the_notes_back(stack, settings):
    tenant, agent_id, key = await _agent(stack, settings)
    async with client(stack, key) as c:
        await c.save_note("release", "Kestrel release", "The kestrel release goes out on Tuesdays", ["u1"])
        await c.save_note("release", "Kestrel release", "Tuesdays, after the reviewer's approval", ["u1", "u2"], 1)
        await c.save_note("gone", "Kestrel budget", "4200 euros", [{"conversation": "s2", "id": "v1"}])
        await c.forget_note("gone")
    async with client(stack, key, user="fay") as c:
        await c.save_note("fay-cards", "Fay's cards", "Fay holds the ace and the king", ["f1"])
    from projections.redis.note_view import NoteView
    from projections.redis.record_view import RedisRecords

    live = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        rebuilt = await rebuilt_redis(stack, live)
        # The new generation holds the notes at their revisions, filled from the log alone.
        view = NoteView(RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=rebuilt, namespace=settings.topic_prefix))
        try:
            assert [await view.revision(tenant, agent_id, user, n) for user, n in
                    ((None, "release"), (None, "gone"), ("fay", "fay-cards"))] == [2, 0, 1]
        finally:
            await view.records.aclose()
    finally:
        await live.aclose()
    async with client(stack, key) as c:
        read = await c.read_note("release")
        assert (read["revision"], read["summary"]) == (2, "Tuesdays, after the reviewer's approval")
        await refused(c.read_note("gone"), 404, "NOT_FOUND")
        assert note_ids(await c.recall("c", "kestrel release")) == ["release"]
        # The ledger kept the revisions: the rebuilt view and the ledger agree.
        assert (await c.save_note("release", "Kestrel release", "Tuesdays", ["u1"], 2))["note"]["revision"] == 3
    async with client(stack, key, user="fay") as c:
        assert (await c.read_note("fay-cards"))["summary"] == "Fay holds the ace and the king"


async def test_notes_need_memory_and_history_on_and_a_live_turn_to_change(stack, new_agent, agent):
    from events.config import MemoryConfig

    _, _, off = await new_agent(AgentConfig(memory=MemoryConfig(enabled=False), history=HistoryConfig()))
    _, _, no_history = await new_agent(AgentConfig())
    async with client(stack, off) as c:
        await refused(c.save_note("n", "t", "s", ["u1"]), 403, "MEMORY_DISABLED", "memory.enabled")
        await refused(c.read_note("n"), 403, "MEMORY_DISABLED")
        assert (await c.recall("c", "anything"))["notes"] == []
    async with client(stack, no_history) as c:
        await refused(c.save_note("n", "t", "s", ["u1"]), 403, "HISTORY_DISABLED", "harness.history")
        await refused(c.search_notes(), 403, "HISTORY_DISABLED")
    async with client(stack, agent[2], preview=True) as c:  # a preview turn reads notes, never changes them
        await refused(c.save_note("n", "t", "s", ["u1"]), 403, "PREVIEW_READ_ONLY", "x-preview")
        await refused(c.forget_note("n"), 403, "PREVIEW_READ_ONLY")
        assert isinstance((await c.search_notes())["notes"], list)
