"""Who is calling: the one auth and context dependency every route uses (memory, history, admin).

A key speaks for its own agent only. An operator key names the agent (X-Agent) and, for the
bootstrap key, the tenant (X-Tenant) it acts on.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from events.errors import ErrorCode
from services.auth import Principal
from services.errors import ApiError
from services.memory import Context, MemoryService


async def principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    key = (authorization or "").removeprefix("Bearer ").strip()
    p = await request.app.state.keys.resolve(key)
    if p is None:
        raise ApiError(ErrorCode.UNAUTHENTICATED, "authorization", "send 'Authorization: Bearer <api key>'", 401)
    return p


def resolve_context(p: Principal, x_agent, x_tenant, x_session, x_preview, x_turn_ref=None, x_execution_id=None,
                    x_turn=None) -> Context:
    if p.role == "operator":
        if not x_agent or not (x_tenant or p.tenant != "*"):
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-agent", "an operator key must name X-Tenant and X-Agent")
        tenant = x_tenant if p.tenant == "*" else p.tenant
        p = Principal(tenant, x_agent, "operator")
    elif x_agent and x_agent != p.agent:
        raise ApiError(ErrorCode.FORBIDDEN, "x-agent", "this key belongs to another agent", 403)
    return Context(p, p.agent, x_session, x_preview, x_turn_ref, x_execution_id, x_turn)


async def context(
    p: Annotated[Principal, Depends(principal)],
    x_agent: Annotated[str | None, Header()] = None,
    x_tenant: Annotated[str | None, Header()] = None,
    x_session: Annotated[str | None, Header()] = None,
    x_preview: Annotated[bool, Header()] = False,
    x_turn_ref: Annotated[str | None, Header()] = None,
    x_execution_id: Annotated[str | None, Header()] = None,
    x_turn: Annotated[int | None, Header(ge=0)] = None,
) -> Context:
    return resolve_context(p, x_agent, x_tenant, x_session, x_preview, x_turn_ref, x_execution_id, x_turn)


def service(request: Request) -> MemoryService:
    return request.app.state.service


Caller = Annotated[Principal, Depends(principal)]
Ctx = Annotated[Context, Depends(context)]
Svc = Annotated[MemoryService, Depends(service)]
