"""The one auth and context dependency, shared by every router (history included), and the one error body."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from events.errors import ErrorCode
from services.auth import Principal
from services.errors import ApiError
from services.http import deps, errors
from services.http.routes import keys, whoami
from services.http.routes.history import HistoryExtension
from tests.fakes.keys import InMemoryKeyStore


def test_an_agent_key_speaks_for_its_own_agent_only():
    p = Principal("t", "a", "agent", "k1")
    ctx = deps.resolve_context(p, None, None, "s1", False, x_turn=3)
    assert (ctx.tenant, ctx.agent, ctx.session, ctx.turn, ctx.principal) == ("t", "a", "s1", 3, p)
    with pytest.raises(ApiError) as e:
        deps.resolve_context(p, "b", None, None, False)
    assert (e.value.code, e.value.field, e.value.status) == (ErrorCode.FORBIDDEN, "x-agent", 403)


def test_an_operator_key_names_its_agent_and_the_bootstrap_key_its_tenant():
    boot = Principal("*", None, "operator")
    with pytest.raises(ApiError) as e:
        deps.resolve_context(boot, "a", None, None, False)
    assert (e.value.code, e.value.field, e.value.status) == (ErrorCode.VALIDATION_FAILED, "x-agent", 422)
    ctx = deps.resolve_context(boot, "a", "t2", None, False)
    assert (ctx.tenant, ctx.agent, ctx.principal.role) == ("t2", "a", "operator")
    # A tenant's operator key acts in its own tenant, whatever X-Tenant says.
    assert deps.resolve_context(Principal("t", None, "operator"), "a", "t2", None, False).tenant == "t"


def _uses(dependant, call) -> bool:
    return dependant.call is call or any(_uses(d, call) for d in dependant.dependencies)


def test_history_search_resolves_its_caller_with_the_shared_dependency():
    [route] = [r for r in HistoryExtension().router.routes if r.path == "/v1/history/search"]
    assert _uses(route.dependant, deps.context) and _uses(route.dependant, deps.principal)


def test_an_unknown_key_gets_the_one_error_body():
    app = FastAPI()
    errors.install(app)
    app.include_router(whoami.router)
    app.state.keys = keys_ = InMemoryKeyStore()
    good = keys_.add("good", "t", "a", "agent")
    with TestClient(app) as client:
        bad = client.get("/v1/whoami", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        assert bad.json() == {"error": {"code": "UNAUTHENTICATED", "field": "authorization",
                                        "message": "send 'Authorization: Bearer <api key>'"}}
        ok = client.get("/v1/whoami", headers={"Authorization": "Bearer good"})
        assert ok.json() == {"tenant": "t", "agent": "a", "role": "agent", "key_id": good["id"], "user": None}


# --------------------------------------------------------------------------- members, X-User, X-Channel


def refusal(call) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    return e.value


def test_x_user_and_x_channel_reach_the_context_and_bad_ones_are_refused_naming_the_header():
    p = Principal("t", "a", "agent", "k1")
    ctx = deps.resolve_context(p, None, None, "s1", False, x_user="dana@acme.io", x_channel="dashboardChat")
    assert (ctx.user, ctx.channel, ctx.session) == ("dana@acme.io", "dashboardChat", "s1")
    assert deps.resolve_context(p, None, None, None, False).user is None
    for bad in ("dana smith", "a/b", "", "x" * 129, "dana\n"):
        e = refusal(lambda bad=bad: deps.resolve_context(p, None, None, None, False, x_user=bad))
        assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-user", 422), bad
    for bad in ("slack channel", "a.b", "x" * 65):
        e = refusal(lambda bad=bad: deps.resolve_context(p, None, None, None, False, x_channel=bad))
        assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-channel", 422), bad


def test_an_agent_or_helper_key_may_name_any_member_and_an_operator_key_names_one_too():
    for role in ("agent", "helper"):
        assert deps.resolve_context(Principal("t", "a", role), None, None, None, False, x_user="u9").user == "u9"
    op = deps.resolve_context(Principal("*", None, "operator"), "a", "t", None, False, x_user="u9")
    assert (op.tenant, op.agent, op.user, op.principal.role) == ("t", "a", "u9", "operator")


def test_a_member_key_speaks_for_its_own_member_on_its_own_agent():
    m = Principal("t", "a", "member", "k2", "dana")
    ctx = deps.resolve_context(m, None, None, "s1", True, "turn-1", "exec-1", 4)
    # Its own member, on its own agent; never a session's, a preview's or a turn's records.
    assert (ctx.tenant, ctx.agent, ctx.user, ctx.principal.user, ctx.principal.role) == ("t", "a", "dana", "dana",
                                                                                          "member")
    assert (ctx.session, ctx.preview, ctx.turn_ref, ctx.turn) == (None, False, None, None)
    assert deps.resolve_context(m, "a", None, None, False, x_user="dana").user == "dana"
    e = refusal(lambda: deps.resolve_context(m, None, None, None, False, x_user="erin"))
    assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "x-user", 403)
    e = refusal(lambda: deps.resolve_context(m, "b", None, None, False))
    assert (e.code, e.field, e.status) == (ErrorCode.FORBIDDEN, "x-agent", 403)
    # X-Tenant changes nothing: a member key stays in its tenant.
    assert deps.resolve_context(m, None, "other", None, False).tenant == "t"


def test_a_member_key_of_every_agent_names_the_agent():
    m = Principal("t", None, "member", "k3", "dana")
    e = refusal(lambda: deps.resolve_context(m, None, None, None, False))
    assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-agent", 422)
    e = refusal(lambda: deps.resolve_context(m, "@workspace", None, None, False))
    assert (e.code, e.field) == (ErrorCode.VALIDATION_FAILED, "x-agent")
    ctx = deps.resolve_context(m, "b", None, None, False)
    assert (ctx.agent, ctx.principal.agent, ctx.user) == ("b", "b", "dana")


def test_member_keys_can_edit_but_never_make_the_agents_tool_writes():
    assert Principal("t", "a", "agent").can_write and Principal("t", None, "operator").can_write
    assert not Principal("t", "a", "helper").can_write
    member = Principal("t", "a", "member", user="dana")
    assert member.is_member and not member.can_write


def test_the_bootstrap_key_names_its_tenant_for_tenant_wide_calls():
    assert deps.tenant_of(Principal("t", None, "operator"), "other") == "t"
    assert deps.tenant_of(Principal("*", None, "operator"), "acme") == "acme"
    for bad in (None, "a/b"):
        e = refusal(lambda bad=bad: deps.tenant_of(Principal("*", None, "operator"), bad))
        assert (e.code, e.field) == (ErrorCode.VALIDATION_FAILED, "x-tenant")


class _Service:
    """The one call the keys routes make of the memory service: no tenant or member here is removed."""

    class commands:  # noqa: N801 - stands in for the service's `commands` attribute
        @staticmethod
        async def check_not_removed(tenant, agent, user) -> None:
            return None


def _keys_app():
    app = FastAPI()
    errors.install(app)
    app.include_router(keys.router)
    app.include_router(whoami.router)
    app.state.keys = InMemoryKeyStore("boot")
    app.state.keys.add("member", "t", "a", "member", "dana")
    app.state.service = _Service()
    return app


@pytest.mark.parametrize("body, field", [
    ({"tenant": "t", "agent": "a", "role": "member"}, "user"),
    ({"tenant": "t", "agent": "a", "role": "agent", "user": "dana"}, "user"),
    ({"tenant": "t", "role": "operator", "user": "dana"}, "user"),
    ({"tenant": "t", "agent": "a", "role": "member", "user": "dana smith"}, "user"),
    ({"tenant": "t", "agent": "a", "role": "member", "user": ""}, "user"),
    ({"tenant": "t", "agent": "a", "role": "owner"}, "role"),
    ({"tenant": "t", "role": "helper"}, "agent"),
])
def test_a_key_request_is_refused_naming_the_field(body, field):
    app = _keys_app()
    with TestClient(app) as client:
        r = client.post("/v1/admin/keys", json=body, headers={"Authorization": "Bearer boot"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == field, r.json()
    assert app.state.keys.issued == []


def test_a_member_key_names_its_user_and_its_agent_or_every_agent_and_lists_with_it():
    app = _keys_app()
    with TestClient(app) as client:
        h = {"Authorization": "Bearer boot"}
        one = client.post("/v1/admin/keys", json={"tenant": "t", "agent": "a", "role": "member", "user": "dana"},
                          headers=h)
        every = client.post("/v1/admin/keys", json={"tenant": "t", "role": "member", "user": "erin"}, headers=h)
        assert (one.status_code, one.json()["user"], one.json()["agent"]) == (201, "dana", "a")
        assert (every.status_code, every.json()["user"], every.json()["agent"]) == (201, "erin", None)
        agent = client.post("/v1/admin/keys", json={"tenant": "t", "agent": "a"}, headers=h)
        assert agent.status_code == 201 and "user" not in agent.json()
        assert app.state.keys.issued == [("t", "a", "member", "dana"), ("t", None, "member", "erin"),
                                         ("t", "a", "agent", None)]
        listed = client.get("/v1/admin/keys", params={"tenant": "t"}, headers=h).json()["keys"]
        # A member key lists its user; the other keys' entries are as they were.
        entry = {"id", "tenant", "agent", "role", "created"}
        assert [set(k) for k in listed] == [entry | {"user"}] * 3 + [entry]
        m = {"Authorization": "Bearer member"}
        assert client.get("/v1/whoami", headers=m).json()["user"] == "dana"
        refused = client.post("/v1/admin/keys", json={"tenant": "t", "agent": "a"}, headers=m)
        assert (refused.status_code, refused.json()["error"]["field"]) == (403, "authorization")


def test_an_index_that_cannot_answer_is_a_503_the_caller_may_retry():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from projections.qdrant.index import IndexUnavailable
    from services.http.errors import install

    app = FastAPI()
    install(app)

    @app.get("/boom")
    async def boom():
        raise IndexUnavailable("shard closed")

    r = TestClient(app).get("/boom")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "UNAVAILABLE" and "shard closed" not in r.text


# --------------------------------------------------------------------------- X-Agent, the deployment's key

import asyncio  # noqa: E402

from services.auth import KeyStore  # noqa: E402
from services.http.routes.search import deployment_key  # noqa: E402


@pytest.mark.parametrize("bad", ["@workspace", "a/b", "bot one", "", "x" * 129])
def test_x_agent_is_an_agents_id_for_every_key_that_reads_it(bad):
    keys = {"member of every agent": Principal("t", None, "member", "k3", "dana"),
            "member": Principal("t", "a", "member", "k2", "dana"),
            "tenant operator": Principal("t", None, "operator", "k4"),
            "deployment": Principal("*", None, "operator", deployment=True),
            "agent": Principal("t", "a", "agent", "k1")}
    for name, p in keys.items():
        e = refusal(lambda p=p: deps.resolve_context(p, bad, "t", None, False))
        assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-agent", 422), (name, bad)


def test_the_deployments_key_names_a_tenant_that_is_an_id():
    boot = Principal("*", None, "operator", deployment=True)
    for bad in ("a/b", "ten ant"):
        e = refusal(lambda bad=bad: deps.resolve_context(boot, "a", bad, None, False))
        assert (e.code, e.field, e.status) == (ErrorCode.VALIDATION_FAILED, "x-tenant", 422)


def test_only_the_key_store_marks_the_deployments_key_and_the_context_keeps_the_mark():
    store = KeyStore(None, "the-deployments-key")  # the settings' key is never looked up in Redis
    boot = asyncio.run(store.resolve("the-deployments-key"))
    assert (boot.role, boot.key_id, boot.deployment) == ("operator", None, True) and deployment_key(boot)
    ctx = deps.resolve_context(boot, "a", "t", None, False, x_user="dana")
    assert (ctx.tenant, ctx.agent, ctx.principal.deployment) == ("t", "a", True) and deployment_key(ctx.principal)
    # An issued operator key is never the deployment's, whatever its id (a key with none included).
    for issued in (Principal("t", None, "operator", "k4"), Principal("t", None, "operator"),
                   Principal("*", None, "operator")):
        assert not deployment_key(issued)
        assert not deployment_key(deps.resolve_context(issued, "a", "t", None, False).principal)
    assert not deployment_key(Principal("t", "a", "agent", deployment=False))
