"""Pure rules of the API surface: which bodies are refused before routing, what /health
concludes from what it saw, and the MCP server's reply to a line the SDK cannot take."""

from __future__ import annotations

import json

from services.http.health_probe import Observed, assess
from services.http.input_guard import MAX_BODY_BYTES, body_refusal, unencodable_field
from services.mcp_server import refusal


def test_a_lone_surrogate_is_named_by_its_field_and_pairs_pass():
    assert unencodable_field({"labels": {"a": "ok", "b": "x\ud800"}}) == "labels.b"
    assert unencodable_field({"metadata": {"k": [1, {"deep": "\udfff"}]}}) == "metadata.k.1.deep"
    assert unencodable_field({"labels": {"\ud800": "v"}}) == "labels"
    assert unencodable_field({"query": "emoji \U0001F600"}) is None
    assert body_refusal(b'{"q": "\\ud83d\\ude00"}') is None  # an escaped pair is one character
    status, field, message = body_refusal(b'{"tenant": "\\ud800"}')
    assert (status, field) == (422, "tenant") and "UTF-8" in message


def test_raw_bytes_that_are_not_utf8_are_refused_naming_the_field_or_the_byte():
    # A surrogate's raw bytes (ED A0 80), which json.loads reads back as a lone surrogate.
    status, field, message = body_refusal(b'{"query": "q", "kind": "k\xed\xa0\x80"}')
    assert (status, field) == (422, "kind") and "UTF-8" in message
    assert body_refusal(b'{"filters": {"labels": {"t\xed\xb0\x80": "v"}}}')[:2] == (422, "filters.labels")
    status, field, message = body_refusal(b'{"query": "caf\xe9"}')  # Latin-1, not UTF-8
    assert (status, field) == (422, "body") and "byte 14" in message and "0xe9" in message
    assert body_refusal(b'not json \xed\xa0\x80')[:2] == (422, "body")
    assert body_refusal('{"query": "café ☕ \U0001F600"}'.encode()) is None


def test_bodies_over_the_limit_are_refused_and_depth_does_not_exhaust_the_walk():
    assert body_refusal(b"x" * (MAX_BODY_BYTES + 1))[0] == 413
    deep: dict = {"leaf": "\ud800"}
    for _ in range(5000):
        deep = {"n": deep}
    assert unencodable_field(deep).endswith(".leaf")


def test_health_degrades_for_a_dead_or_lagging_worker_and_a_stopped_task():
    seen = Observed(beats={"ledger": None, "embedding": {"group": "g"}, "history": {"group": "h"}},
                    lags={"embedding": 50_001, "history": 3})
    workers, problems = assess(seen, max_lag=50_000, tasks={"memory projection": False, "history projection": True})
    assert workers["ledger"] == {"alive": False, "lag": None} and workers["history"] == {"alive": True, "lag": 3}
    assert [p.split(":")[0] for p in problems] == ["worker embedding", "worker ledger", "memory projection"]
    assert assess(Observed(beats={"history": {"group": "h"}}, lags={"history": 0}), 10, {"x": True})[1] == []


def test_the_mcp_server_answers_a_line_it_cannot_take():
    bad = '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"arguments": {"q": "\\ud800"}}}'
    reply = json.loads(refusal(bad).model_dump_json())
    assert reply["id"] == 7 and "lone surrogate" in reply["error"]["message"]
    assert json.loads(refusal("not json").model_dump_json())["id"] is None
    assert refusal('{"jsonrpc": "2.0", "method": "notifications/x", "params": {"a": "\\ud800"}}') is None
    deep = '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": ' + '[' * 5000 + ']' * 5000 + '}'
    reply = json.loads(refusal(deep).model_dump_json())
    assert reply["id"] is None and "nested too deep" in reply["error"]["message"]


# --------------------------------------------------------------------------- members, consent, subjects
# The memory service's submission rules for member, agent, helper and operator keys, on
# in-memory ports: what is refused (naming the field) before anything reaches the commands log.

import dataclasses  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

import pytest  # noqa: E402

from events import AgentConfig, ConsentGranted, RecordAdded, member_facts  # noqa: E402
from events.commands import WORKSPACE  # noqa: E402
from events.errors import ErrorCode  # noqa: E402
from events.record import MemoryRecord, Source  # noqa: E402
from services.auth import Principal  # noqa: E402
from services.errors import ApiError  # noqa: E402
from services.memory import Context, MemoryService  # noqa: E402
from settings import Settings  # noqa: E402
from tests.fakes.embedder import HashEmbedder  # noqa: E402
from tests.fakes.memory_ports import ConfiguredFold, InMemoryCommandPublisher, InMemoryUsageRecorder  # noqa: E402

NOW = datetime(2026, 3, 1, tzinfo=UTC)
OPEN = AgentConfig.model_validate({"memory": {"scope": {"read": ["session", "user", "agent"],
                                                        "write": ["session", "user", "agent"]},
                                              "tools": ["add_memory", "read_memory", "delete_memory", "pin_memory",
                                                        "unpin_memory", "report_outcome", "curate_block"]}})



def _service(cfg: AgentConfig = OPEN):
    records = ConfiguredFold(configs={("t", "a"): cfg})
    publisher = InMemoryCommandPublisher()
    return MemoryService(Settings(), records, None, HashEmbedder(), publisher, InMemoryUsageRecorder()), records, publisher


def _ctx(role: str, user: str | None = None, channel: str | None = None) -> Context:
    p = Principal("t", "a", role, "k", user if role == "member" else None)
    return Context(p, "a", session=None if role == "member" else "s1", user=user, channel=channel)


async def _refused(call) -> ApiError:
    with pytest.raises(ApiError) as e:
        await call
    return e.value


async def _hold(records: ConfiguredFold, *recs: MemoryRecord) -> None:
    await records.apply([RecordAdded(event_id=f"e-{r.id}", command_id=f"c-{r.id}", tenant="t", agent="a",
                                     occurred_at=NOW, record=r) for r in recs])


def _rec(rid: str, scope: str, user: str | None = None) -> MemoryRecord:
    return MemoryRecord(id=rid, version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope=scope,
                        session="s1" if scope == "SESSION" else None, user=user, kind="fact", summary=f"record {rid}")


async def test_every_command_carries_its_member_and_a_member_key_writes_as_the_member():
    s, _, publisher = _service()
    await s.commands.add(_ctx("agent", "dana", "api"), wait=False, summary="Dana prefers tea")
    await s.commands.edit(_ctx("member", "dana"), "r1", wait=False, summary="Dana prefers green tea")
    await s.commands.delete(_ctx("member", "dana"), "r1", wait=False)
    add, edit, delete = publisher.commands
    assert (add.user, add.provenance.user, add.provenance.source, add.provenance.modified_by) == (
        "dana", "dana", Source.TOOL, "agent:a")
    for cmd in (edit, delete):
        assert (cmd.user, cmd.provenance.user, cmd.provenance.source, cmd.provenance.modified_by) == (
            "dana", "dana", Source.MEMBER, "member:dana")
    assert delete.session is None  # a member key speaks for no session
    assert [c.type for c in publisher.commands] == ["AddMemory", "EditMemory", "DeleteMemory"]


async def test_a_member_key_never_makes_the_agents_writes_and_nothing_is_sent():
    s, _, publisher = _service()
    m = _ctx("member", "dana")
    for call in (s.commands.add(m, wait=False, summary="x"), s.commands.pin(m, "r1", True, wait=False),
                 s.commands.report(m, "r1", True, wait=False),
                 s.commands.curate(m, "style", "add", "Tabs", None, wait=False),
                 s.commands.configure(m, AgentConfig(), wait=False),
                 s.commands.erase_subject(m, "dana", wait=False), s.commands.remove_agent(m, wait=False),
                 s.commands.remove_user(m, "dana", wait=False)):
        e = await _refused(call)
        assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "authorization", 403), e.message
    assert publisher.sent == []


async def test_consent_is_granted_by_the_member_alone_and_withdrawn_by_the_member_or_an_operator():
    s, _, publisher = _service()
    for role in ("agent", "helper", "operator"):
        e = await _refused(s.commands.grant_consent(_ctx(role, "dana"), wait=False))
        assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "authorization", 403)
    for role in ("agent", "helper"):
        e = await _refused(s.commands.withdraw_consent(_ctx(role, "dana"), wait=False))
        assert (e.code, e.field) == (ErrorCode.FORBIDDEN, "authorization")
    e = await _refused(s.commands.withdraw_consent(_ctx("operator"), wait=False))
    assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-user", 422)
    assert publisher.sent == []
    await s.commands.grant_consent(_ctx("member", "dana"), wait=False)
    await s.commands.withdraw_consent(_ctx("member", "dana"), wait=False)
    await s.commands.withdraw_consent(_ctx("operator", "dana"), wait=False)
    assert [(c.type, c.user, c.agent) for c in publisher.commands] == [
        ("GrantConsent", "dana", "a"), ("WithdrawConsent", "dana", "a"), ("WithdrawConsent", "dana", "a")]


async def test_only_an_operator_erases_a_subject_or_removes_an_agent_or_a_member():
    s, _, publisher = _service()
    for role in ("agent", "helper"):
        for call in (s.commands.erase_subject(_ctx(role, "dana"), "dana", wait=False),
                     s.commands.remove_agent(_ctx(role), wait=False),
                     s.commands.remove_user(_ctx(role), "dana", wait=False)):
            e = await _refused(call)
            assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "authorization", 403)
    op = _ctx("operator")
    await s.commands.erase_subject(op, "dana", wait=False)
    await s.commands.remove_agent(op, wait=False)
    await s.commands.remove_user(op, "erin", wait=False)
    assert [(c.type, c.user, c.agent) for c in publisher.commands] == [
        ("EraseSubject", "dana", "a"), ("RemoveAgent", None, "a"), ("RemoveUser", "erin", WORKSPACE)]


async def test_an_agents_tool_write_asks_the_subject_rule_first():
    s, records, publisher = _service(member_facts(tools=["add_memory", "delete_memory", "curate_block"]))
    e = await _refused(s.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana prefers tea"))
    assert (e.code, e.field, e.status) == (ErrorCode.CONSENT_REQUIRED, "user", 403)
    e = await _refused(s.commands.add(_ctx("agent"), wait=False, summary="Dana prefers tea"))
    assert (e.code, e.field) == (ErrorCode.CONSENT_REQUIRED, "user") and "X-User" in e.message
    e = await _refused(s.commands.curate(_ctx("agent", "dana"), "style", "add", "Tabs", None, wait=False))
    assert e.code == ErrorCode.CONSENT_REQUIRED
    assert publisher.sent == []
    await records.apply([ConsentGranted(event_id="g", command_id="g", tenant="t", agent="a", occurred_at=NOW,
                                        user="dana")])
    e = await _refused(s.commands.add(_ctx("agent", "dana", "slack"), wait=False, summary="Dana prefers tea"))
    assert (e.code, e.field, e.status) == (ErrorCode.CHANNEL_NOT_ALLOWED, "channel", 403)
    e = await _refused(s.commands.add(_ctx("agent", "erin"), wait=False, summary="Erin prefers tea"))
    assert e.code == ErrorCode.CONSENT_REQUIRED  # consent is per member
    await s.commands.add(_ctx("agent", "dana", "studio"), wait=False, summary="Dana prefers tea")
    assert [c.user for c in publisher.commands] == ["dana"]
    records.removed_users.add(("t", "dana"))
    e = await _refused(s.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana prefers coffee"))
    assert (e.code, e.field) == (ErrorCode.SUBJECT_REMOVED, "user")
    records.removed_agents.add(("t", "a"))
    e = await _refused(s.commands.delete(_ctx("agent", "dana"), "r1", wait=False))
    assert (e.code, e.field) == (ErrorCode.SUBJECT_REMOVED, "agent")
    # Members and operators are not the agent's tool writes: the ledger has the last word on theirs.
    await s.commands.delete(_ctx("member", "dana"), "r1", wait=False)
    await s.commands.erase_subject(_ctx("operator"), "dana", wait=False)
    assert [c.type for c in publisher.commands] == ["AddMemory", "DeleteMemory", "EraseSubject"]


async def test_a_members_facts_are_addressed_by_that_member_alone():
    s, records, publisher = _service()
    await _hold(records, _rec("dana1", "USER", "dana"), _rec("shared", "AGENT"), _rec("sess", "SESSION"))
    not_found = (ErrorCode.NOT_FOUND, "record_id", 404)
    for ctx, rid in ((_ctx("operator"), "dana1"),
                     (_ctx("agent", "erin"), "dana1"), (_ctx("agent"), "dana1"),
                     (_ctx("member", "erin"), "dana1"), (_ctx("member", "dana"), "shared"),
                     (_ctx("member", "dana"), "sess")):
        e = await _refused(s.commands.delete(ctx, rid, wait=False))
        assert (e.code, e.field, e.status) == not_found, (ctx.principal.role, ctx.user, rid)
    for call in (s.commands.edit(_ctx("operator"), "dana1", wait=False, summary="x"),
                 s.commands.edit(_ctx("member", "erin"), "dana1", wait=False, summary="x"),
                 s.commands.pin(_ctx("agent", "erin"), "dana1", True, wait=False),
                 s.commands.report(_ctx("agent", "erin"), "dana1", True, wait=False)):
        assert (await _refused(call)).code == ErrorCode.NOT_FOUND
    assert publisher.sent == []
    await s.commands.delete(_ctx("member", "dana"), "dana1", wait=False)
    await s.commands.delete(_ctx("agent", "dana"), "dana1", wait=False)
    await s.commands.delete(_ctx("operator"), "shared", wait=False)
    assert [c.record_id for c in publisher.commands] == ["dana1", "dana1", "shared"]


async def test_an_agent_key_still_cannot_edit_and_the_consent_read_needs_a_member():
    s, records, _ = _service(member_facts())
    e = await _refused(s.commands.edit(_ctx("agent", "dana"), "r1", wait=False, summary="x"))
    assert (e.code, e.field) == (ErrorCode.FORBIDDEN, "authorization")
    e = await _refused(s.consent(_ctx("agent")))
    assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-user", 422)
    e = await _refused(s.consent(_ctx("helper", "dana")))
    assert (e.code, e.field) == (ErrorCode.FORBIDDEN, "authorization")
    before = await s.consent(_ctx("member", "dana"))
    assert (before["consent"], before["required"], before["memory"], before["refusal"]["code"]) == (
        None, True, False, "CONSENT_REQUIRED")
    await records.apply([ConsentGranted(event_id="g", command_id="g", tenant="t", agent="a", occurred_at=NOW,
                                        user="dana")])
    after = await s.consent(_ctx("agent", "dana"))
    assert (after["user"], after["consent"], after["memory"], after["refusal"]) == ("dana", "granted", True, None)
    assert (await s.consent(_ctx("agent", "dana", "slack")))["refusal"]["code"] == "CHANNEL_NOT_ALLOWED"


# --------------------------------------------------------------------------- write answers, operators' writes, kinds

from events.commands import AddMemory  # noqa: E402
from events.record import Scope  # noqa: E402


def _added(r: MemoryRecord, merged: bool = False) -> RecordAdded:
    return RecordAdded(event_id=f"e-{r.id}", command_id="X", tenant="t", agent="a", occurred_at=NOW, record=r,
                       merged=merged)


def _cmd(ctx: Context, s: MemoryService) -> AddMemory:
    return s.commands._command(AddMemory, ctx, command_id="X", summary="Bob likes jazz")


async def test_a_write_answer_never_shows_a_record_its_caller_could_not_read():
    # A command id another caller used is answered with that caller's events (the ledger's
    # redelivery): the answer leaves out every record the caller may not read, and its id.
    s, records, _ = _service()
    alice = _rec("alice1", "USER", "alice")
    sess = _rec("sess", "SESSION")
    await _hold(records, alice, sess)
    for ctx in (_ctx("agent", "bob"), _ctx("helper", "bob"), _ctx("operator"), _ctx("member", "bob")):
        for events in ([_added(alice)], [_added(alice, merged=True)]):
            out = await s.commands._outcome(_cmd(ctx, s), events, ctx)
            assert (out["memories"], "id" in out, "merged" in out) == ([], False, False), ctx.principal.role
    other_session = dataclasses.replace(_ctx("agent", "alice"), session="s2")
    assert (await s.commands._outcome(_cmd(other_session, s), [_added(sess)], other_session))["memories"] == []
    # Without a caller, nothing is shown; the caller who may read it gets it.
    assert (await s.commands._outcome(_cmd(_ctx("agent", "alice"), s), [_added(alice)], None))["memories"] == []
    own = await s.commands._outcome(_cmd(_ctx("agent", "alice"), s), [_added(alice, merged=True)],
                                    _ctx("agent", "alice"))
    assert ([m["id"] for m in own["memories"]], own["id"], own["merged"]) == (["alice1"], "alice1", True)
    assert (await s.commands._outcome(_cmd(_ctx("member", "alice"), s), [_added(alice)],
                                      _ctx("member", "alice")))["id"] == "alice1"


async def test_an_operator_never_writes_a_members_memory_but_withdraws_erases_and_removes():
    s, records, publisher = _service()
    await _hold(records, _rec("shared", "AGENT"))
    op, op_dana = _ctx("operator"), _ctx("operator", "dana")
    for call in (s.commands.add(op_dana, wait=False, summary="Dana prefers tea"),
                 s.commands.add(op_dana, wait=False, summary="Dana prefers tea", scope="AGENT"),
                 s.commands.delete(op_dana, "shared", wait=False),
                 s.commands.edit(op_dana, "shared", wait=False, summary="x"),
                 s.commands.pin(op_dana, "shared", True, wait=False),
                 s.commands.report(op_dana, "shared", True, wait=False),
                 s.commands.curate(op_dana, "style", "add", "Tabs", None, wait=False),
                 s.commands.curate(op_dana, "style", "add", "Tabs", None, scope="workspace", wait=False)):
        e = await _refused(call)
        assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "x-user", 403), e.message
    for scope in ("USER", Scope.USER):
        e = await _refused(s.commands.add(op, wait=False, summary="Dana prefers tea", scope=scope))
        assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "scope", 403)
    assert publisher.sent == []
    await s.commands.withdraw_consent(op_dana, wait=False)
    await s.commands.erase_subject(op_dana, "dana", wait=False)
    await s.commands.remove_user(op_dana, "dana", wait=False)
    await s.commands.add(op, wait=False, summary="The office closes at 18:00", scope="AGENT")
    await s.commands.delete(op, "shared", wait=False)
    assert [c.type for c in publisher.commands] == ["WithdrawConsent", "EraseSubject", "RemoveUser", "AddMemory",
                                                    "DeleteMemory"]
    assert publisher.commands[3].user is None
    # The agent still writes for its member.
    await s.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana prefers tea", scope="USER")
    assert (publisher.commands[-1].user, publisher.commands[-1].scope) == ("dana", Scope.USER)


async def test_an_add_that_names_no_kind_is_of_the_agents_default_kind():
    preset = member_facts(tools=["add_memory"])
    s, records, publisher = _service(preset)
    await records.apply([ConsentGranted(event_id="g", command_id="g", tenant="t", agent="a", occurred_at=NOW,
                                        user="dana")])
    await s.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana's cat is named Miso")
    await s.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana takes the 8:15 train", kind="episodic")
    s2, _, publisher2 = _service()
    await s2.commands.add(_ctx("agent", "dana"), wait=False, summary="Dana prefers tea")
    assert [c.kind for c in publisher.commands + publisher2.commands] == ["profile", "episodic", "fact"]


async def test_a_write_addresses_only_what_its_caller_may_read():
    # The reads' rule (`readable_by`): another session's record and a preview record are not
    # the agent's to address from this session, or from a live turn.
    s, records, publisher = _service()
    await _hold(records, _rec("sess", "SESSION"), _rec("prev", "AGENT").model_copy(update={"preview": True}))
    other = dataclasses.replace(_ctx("agent"), session="s2")
    for ctx, rid in ((other, "sess"), (_ctx("agent"), "prev")):
        e = await _refused(s.commands.delete(ctx, rid, wait=False))
        assert (e.code, e.field, e.status) == (ErrorCode.NOT_FOUND, "record_id", 404), rid
    assert publisher.sent == []
    await s.commands.delete(_ctx("agent"), "sess", wait=False)
    await s.commands.delete(dataclasses.replace(_ctx("agent"), preview=True), "prev", wait=False)
    assert [c.record_id for c in publisher.commands] == ["sess", "prev"]
