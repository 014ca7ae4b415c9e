"""Who is calling: the one auth and context dependency every route uses (memory, history, admin).

A key speaks for its own agent only. An operator key names the agent (X-Agent) and, for the
bootstrap key, the tenant (X-Tenant) it acts on. A member key speaks for its own member on its
agent, or, bound to every agent of its tenant, on the agent X-Agent names.

`X-User` names the member a call speaks for (the subject of user-scope memory, with the tenant
and agent): an agent or helper key may name any member of its platform (the platform vouches for
its signed-in members); a member key's member is its own, and naming another is refused; an
operator key names one only to read or change a member's consent, never to read or write their facts.
`X-Channel` names the session's channel (memory.channels). X-Agent, X-User, X-Tenant and
X-Channel are checked as ids wherever they are read (422 naming the header); X-Agent never
names the workspace (`@workspace`), which holds blocks, not an agent's memory.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Annotated, cast, overload

from fastapi import Depends, Header, Request

from events.base import IDENT_PATTERN
from events.commands import WORKSPACE
from events.errors import ErrorCode
from events.turns import CHANNEL_PATTERN
from services.auth import Principal
from services.errors import ApiError
from services.http.positions import fence
from services.http.sessions import COOKIE, CSRF_HEADER
from services.memory import Context, MemoryService

# The contract's rules for a user id (events.base.Ident) and a channel (events.turns.Channel).
_IDENT, _CHANNEL = re.compile(IDENT_PATTERN), re.compile(CHANNEL_PATTERN)


async def principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    key = (authorization or "").removeprefix("Bearer ").strip()
    if not key and COOKIE in request.cookies:
        return await _web_principal(request)
    p = await request.app.state.keys.resolve(key)
    if p is None:
        raise ApiError(ErrorCode.UNAUTHENTICATED, "authorization", "send 'Authorization: Bearer <api key>'", 401)
    return p


async def _web_principal(request: Request) -> Principal:
    """The Memory tab's own calls: its session cookie, and the page's CSRF token beside it."""
    sessions = getattr(request.app.state, "web_sessions", None)  # None: this API serves no web page
    session = await sessions.get(request.cookies.get(COOKIE)) if sessions else None
    if session is None:
        raise ApiError(ErrorCode.UNAUTHENTICATED, "authorization", "the web session ended; sign in again at /ui "
                       "(or send 'Authorization: Bearer <api key>')", 401)
    sent = request.headers.get(CSRF_HEADER, "")
    if not secrets.compare_digest(sent.encode("utf-8", "surrogatepass"), session.csrf.encode()):
        raise ApiError(ErrorCode.FORBIDDEN, CSRF_HEADER, f"{CSRF_HEADER}: a call made with the web session sends "
                       "the page's CSRF token; reload the page", 403)
    return session.principal


@overload
def checked_user(user: str, field: str = "x-user") -> str: ...
@overload
def checked_user(user: None, field: str = "x-user") -> None: ...
def checked_user(user: str | None, field: str = "x-user") -> str | None:
    """A member id as a header or a body names it: letters, digits and `._:@-`, at most 128."""
    if user is not None and not (len(user) <= 128 and _IDENT.fullmatch(user)):
        raise ApiError(ErrorCode.VALIDATION_FAILED, field, f"{field}: an id is 1 to 128 letters, digits "
                       "or ._:@- characters", 422)
    return user


def checked_agent(agent: str | None, field: str = "x-agent") -> str | None:
    """An agent a header names: an id (as `checked_user`), and never the workspace's blocks
    (`@workspace`), which hold no memory of their own and are named by `scope=workspace`."""
    checked_user(agent, field)
    if agent == WORKSPACE:
        raise ApiError(ErrorCode.VALIDATION_FAILED, field, f"{field}: {WORKSPACE} holds workspace-wide blocks, not "
                       "an agent's memory; name an agent", 422)
    return agent


def checked_channel(channel: str | None, field: str = "x-channel") -> str | None:
    if channel is not None and not (len(channel) <= 64 and _CHANNEL.fullmatch(channel)):
        raise ApiError(ErrorCode.VALIDATION_FAILED, field, f"{field}: a channel is 1 to 64 letters, digits, "
                       "_ or - characters", 422)
    return channel


def _member_context(p: Principal, x_agent: str | None, x_user: str | None, x_channel: str | None) -> Context:
    """A member key reads and changes its own member's facts on one agent: never another
    member's, and never a session's or a preview's (its context has neither)."""
    if p.agent is None:
        if not x_agent:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-agent", "x-agent: this member key holds for every agent "
                           "of its tenant; name the agent (X-Agent)", 422)
        agent = x_agent
    elif x_agent and x_agent != p.agent:
        raise ApiError(ErrorCode.FORBIDDEN, "x-agent", "this member key belongs to another agent", 403)
    else:
        agent = p.agent
    if x_user is not None and x_user != p.user:
        raise ApiError(ErrorCode.FORBIDDEN, "x-user", "a member key speaks for its own member only; leave X-User "
                       "out or name that member", 403)
    return Context(dataclasses.replace(p, agent=agent), agent, user=p.user, channel=x_channel)


def resolve_context(p: Principal, x_agent, x_tenant, x_session, x_preview, x_turn_ref=None, x_execution_id=None,
                    x_turn=None, x_user=None, x_channel=None, x_invocation=None, x_agent_version=None) -> Context:
    x_user, x_channel, x_agent = checked_user(x_user), checked_channel(x_channel), checked_agent(x_agent)
    if p.role == "member":
        return _member_context(p, x_agent, x_user, x_channel)
    if p.role == "operator":
        if not x_agent or not (x_tenant or p.tenant != "*"):
            raise ApiError(ErrorCode.VALIDATION_FAILED, "x-agent", "an operator key must name X-Tenant and X-Agent")
        tenant = checked_user(x_tenant, "x-tenant") if p.tenant == "*" else p.tenant
        p = dataclasses.replace(p, tenant=tenant, agent=x_agent)  # the deployment's key stays the deployment's
    elif x_agent and x_agent != p.agent:
        raise ApiError(ErrorCode.FORBIDDEN, "x-agent", "this key belongs to another agent", 403)
    # An agent's or helper's key names its agent, and an operator's was given X-Agent above.
    return Context(p, cast(str, p.agent), x_session, x_preview, x_turn_ref, x_execution_id, x_turn, user=x_user,
                   channel=x_channel, invocation=x_invocation, agent_version=x_agent_version)


async def context(
    request: Request,
    p: Annotated[Principal, Depends(principal)],
    x_agent: Annotated[str | None, Header()] = None,
    x_tenant: Annotated[str | None, Header()] = None,
    x_session: Annotated[str | None, Header()] = None,
    x_preview: Annotated[bool, Header()] = False,
    x_turn_ref: Annotated[str | None, Header()] = None,
    x_execution_id: Annotated[str | None, Header()] = None,
    x_turn: Annotated[int | None, Header(ge=0)] = None,
    x_invocation: Annotated[int | None, Header(ge=0, description="the invocation of the execution the call "
                                               "comes from (kept in a write's provenance)")] = None,
    x_agent_version: Annotated[int | None, Header(ge=0, description="the agent version the call comes from "
                                                  "(kept in a write's provenance)")] = None,
    x_user: Annotated[str | None, Header(description="the member the call speaks for (user-scope memory)")] = None,
    x_channel: Annotated[str | None, Header(description="the session's channel (memory.channels)")] = None,
    x_memlane_after: Annotated[str | None, Header(description="positions another replica answered with "
                                                  "(X-Memlane-Position): read what they cover")] = None,
) -> Context:
    ctx = resolve_context(p, x_agent, x_tenant, x_session, x_preview, x_turn_ref, x_execution_id, x_turn,
                          x_user, x_channel, x_invocation, x_agent_version)
    await fence(request.app.state.shards.memory, ctx.tenant, ctx.agent, x_memlane_after)
    return ctx


def tenant_of(p: Principal, x_tenant: str | None) -> str:
    """The tenant an operator key acts on: its own, or, for the bootstrap key, X-Tenant."""
    if p.tenant != "*":
        return p.tenant
    if not x_tenant:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "x-tenant", "x-tenant: the bootstrap operator key names the "
                       "tenant it acts on (X-Tenant)", 422)
    return checked_user(x_tenant, "x-tenant")


def service(request: Request) -> MemoryService:
    return request.app.state.service


Caller = Annotated[Principal, Depends(principal)]
Ctx = Annotated[Context, Depends(context)]
Svc = Annotated[MemoryService, Depends(service)]
