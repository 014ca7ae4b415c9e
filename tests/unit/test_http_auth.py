"""The one auth and context dependency, shared by every router (history included), and the one error body."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from events.errors import ErrorCode
from services.auth import Principal
from services.errors import ApiError
from services.http import deps, errors
from services.http.routes import whoami
from services.http.routes.history import HistoryExtension


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


class _Keys:
    async def resolve(self, key: str | None) -> Principal | None:
        return Principal("t", "a", "agent", "k1") if key == "good" else None


def test_an_unknown_key_gets_the_one_error_body():
    app = FastAPI()
    errors.install(app)
    app.include_router(whoami.router)
    app.state.keys = _Keys()
    with TestClient(app) as client:
        bad = client.get("/v1/whoami", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        assert bad.json() == {"error": {"code": "UNAUTHENTICATED", "field": "authorization",
                                        "message": "send 'Authorization: Bearer <api key>'"}}
        ok = client.get("/v1/whoami", headers={"Authorization": "Bearer good"})
        assert ok.json() == {"tenant": "t", "agent": "a", "role": "agent", "key_id": "k1"}
