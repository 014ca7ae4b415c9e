"""Admin keys: issue, list and revoke a tenant's API keys (operator keys only).

A member key names its member (`user`) and one agent, or none for every agent of the tenant
(each call then names the agent with X-Agent); no other key names a user.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from events.base import Ident
from events.commands import WORKSPACE
from events.errors import ErrorCode
from services.auth import Principal, Role
from services.errors import ApiError
from services.http.deps import Caller, service
from services.http.models import Body
from services.http.responses import IssuedKey, KeysOut, RevokedOut
from services.memory.rules import check_role

router = APIRouter()


class KeyRequest(Body):
    # Names travel in Kafka and Redis keys: the contract's identifier rule, checked here
    # so a bad name is refused when the key is issued, not at its first write.
    tenant: Ident
    agent: Ident | None = None
    role: Role = "agent"
    user: Ident | None = None


def _a(role: str) -> str:
    return f"{'an' if role[0] in 'aeiou' else 'a'} {role}"


def tenant_operator(p: Principal, tenant: str | None, what: str) -> str:
    """The tenant an operator key administers: its own, or, for the bootstrap key, the one named."""
    check_role(p, ("operator",), what)
    if p.tenant == "*":
        if not tenant:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "tenant", f"tenant: name the tenant whose keys to "
                           f"{what.split()[0]}")
        return tenant
    if tenant not in (None, p.tenant):
        raise ApiError(ErrorCode.FORBIDDEN, "tenant", f"only an operator key of this tenant can {what}", 403)
    return p.tenant


@router.post("/v1/admin/keys", status_code=201, response_model=IssuedKey, response_model_exclude_unset=True)
async def issue_key(body: KeyRequest, p: Caller, request: Request):
    if p.role != "operator" or p.tenant not in ("*", body.tenant):
        raise ApiError(ErrorCode.FORBIDDEN, "authorization", "only an operator key of this tenant can issue keys", 403)
    if body.agent == WORKSPACE:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "agent", f"{WORKSPACE} holds workspace-wide blocks; it has no keys")
    if body.tenant.startswith("@"):  # memlane's own pseudo tenants (`events.commands.PLATFORM`) have no keys
        raise ApiError(ErrorCode.VALIDATION_FAILED, "tenant", "tenant: a tenant's name does not start with '@', "
                       "which memlane keeps for its own (the platform's memory); choose another")
    if body.role == "member" and body.user is None:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "user", "user: a member key speaks for one member; name them "
                       "(and an agent, or none for every agent of the tenant)")
    if body.role != "member" and body.user is not None:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "user", f"user: only a member key names a user; {_a(body.role)} "
                       "key names the member per call (X-User)")
    if body.role not in ("operator", "member") and body.agent is None:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "agent", f"agent: {_a(body.role)} key speaks for one agent; name it")
    # Checked last: a request refused for its shape never reads the view. A removal holds until restored.
    await service(request).commands.check_not_removed(body.tenant, body.agent, body.user)
    key, entry = await request.app.state.keys.issue(body.tenant, body.agent, body.role, body.user)
    return {"key": key, **entry}


@router.get("/v1/admin/keys", response_model=KeysOut, response_model_exclude_unset=True)
async def list_keys(p: Caller, request: Request, tenant: Annotated[str | None, Query(max_length=128)] = None):
    """The tenant's keys: id, tenant, agent, role, created, and a member key's user; never a key. The bootstrap
    operator key names the tenant; a tenant's operator key lists its own."""
    tenant = tenant_operator(p, tenant, "list keys")
    return {"keys": await request.app.state.keys.list(tenant)}


@router.delete("/v1/admin/keys/{key_id}", response_model=RevokedOut, response_model_exclude_unset=True)
async def revoke_key(key_id: Annotated[str, Path(max_length=64)], p: Caller, request: Request,
                     tenant: Annotated[str | None, Query(max_length=128)] = None):
    """Revokes a key of the tenant by its id (from the list), at once."""
    tenant = tenant_operator(p, tenant, "revoke keys")
    entry = await request.app.state.keys.revoke(tenant, key_id)
    if entry is None:
        raise ApiError(ErrorCode.NOT_FOUND, "key_id", f"no key {key_id} in this tenant; list them with GET /v1/admin/keys")
    return {"revoked": entry}
