"""Members and subjects: a member's consent, and what an operator does with a subject
(tenant + user + agent): counts, erasure, removing an agent or a member.

- `GET /v1/consent`: the member's consent (a member key: its own; an agent or operator key:
  the member X-User names) and whether they get memory now.
- `POST /v1/consent`, `DELETE /v1/consent`: grant (the member's own key) or withdraw (the
  member's key, or an operator key naming the member) — commands through the ledger.
- `GET /v1/subjects`: the agent's members with their fact counts and consent, never a fact (operator).
- `DELETE /v1/subjects/{user}`: erase the member's memory on the agent (operator).
- `DELETE /v1/agent`: remove the agent: its memory is never served again (operator).
- `DELETE /v1/members/{user}`: remove the member from the tenant: no agent serves them and
  their member keys are revoked, but their facts and consent are kept (operator).
- `DELETE /v1/users/{user}`: delete the user: as a removal, and their memory on every agent is
  wiped at once, consent included (operator). `POST /v1/users/{user}/restore` restores either;
  until then no key is issued to them and they grant no consent.

Each of these but a member's removal, and `DELETE /v1/tenant`, also destroys the data keys of
what it erases once the ledger has recorded it: what was written under them can no longer be
read anywhere. The removal is recorded first: it holds even while the wipe is retried.
- `DELETE /v1/tenant`: remove the whole tenant: every key of its data is destroyed, every
  projection purges it, and its API keys are revoked (the deployment's operator key only).
  `POST /v1/tenant/restore` restores it; until then no key is issued in it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request

from events.base import IDENT_PATTERN
from events.commands import WORKSPACE
from services.auth import Principal
from services.http.deps import Caller, Ctx, Svc, checked_user, tenant_of
from services.memory import Context, MemoryService
from services.memory.rules import check_role

router = APIRouter(tags=["members"])

User = Annotated[str, Path(min_length=1, max_length=128, pattern=IDENT_PATTERN,
                           description="the member's user id")]


@router.get("/v1/consent")
async def read_consent(ctx: Ctx, s: Svc) -> dict[str, Any]:
    """The member's consent on the agent (`granted`, `withdrawn`, or null: never asked),
    whether the agent requires it, and whether the member gets memory now (`refusal` says why not)."""
    return await s.consent(ctx)


@router.post("/v1/consent")
async def grant_consent(ctx: Ctx, s: Svc, wait: bool = True) -> dict[str, Any]:
    """The member grants the agent consent to keep and use memory about them (member keys)."""
    return await s.commands.grant_consent(ctx, wait=wait)


@router.delete("/v1/consent")
async def withdraw_consent(ctx: Ctx, s: Svc, wait: bool = True) -> dict[str, Any]:
    """Withdrawal stops new writes and recall at once and deletes nothing (the member's key,
    or an operator key naming the member with X-User)."""
    return await s.commands.withdraw_consent(ctx, wait=wait)


@router.get("/v1/subjects")
async def list_subjects(ctx: Ctx, s: Svc) -> dict[str, Any]:
    """The agent's members: per user, live fact counts and consent; never a fact (operator keys)."""
    return {"subjects": await s.reads.subjects(ctx)}


@router.delete("/v1/subjects/{user}")
async def erase_subject(user: User, ctx: Ctx, s: Svc, wait: bool = True) -> dict[str, Any]:
    """Erases the member's memory on the agent (X-Agent): every live user-scope fact is
    tombstoned and the consent withdrawn; answers how many facts (operator keys)."""
    return await s.commands.erase_subject(ctx, checked_user(user, "user"), wait=wait)


@router.delete("/v1/agent")
async def remove_agent(ctx: Ctx, s: Svc, wait: bool = True) -> dict[str, Any]:
    """Removes the agent (X-Agent): nothing of its memory is served again, and no write is
    accepted (operator keys)."""
    return await s.commands.remove_agent(ctx, wait=wait)


@router.delete("/v1/users/{user}")
async def delete_user(user: User, p: Caller, s: Svc, request: Request, wait: bool = True,
                      x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Deletes the user: no agent serves their memory again, their member keys are revoked at
    once, and their memory on every agent is wiped, consent included: their facts' data keys are
    destroyed (operator keys; the bootstrap key names the tenant with X-Tenant). `revoked_keys`:
    the ids of the member keys revoked."""
    return await _remove(user, p, s, request, wait, x_tenant, erase=True)


@router.delete("/v1/members/{user}")
async def remove_member(user: User, p: Caller, s: Svc, request: Request, wait: bool = True,
                        x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Removes the member from the tenant without erasing them: no agent serves their memory and
    their member keys are revoked at once, but their facts and consent are kept, served again
    once an operator restores them (POST /v1/users/{user}/restore). Operator keys, as for
    `DELETE /v1/users/{user}`."""
    return await _remove(user, p, s, request, wait, x_tenant, erase=False)


async def _remove(user: str, p: Principal, s: MemoryService, request: Request, wait: bool, x_tenant: str | None,
                  erase: bool) -> dict[str, Any]:
    check_role(p, ("operator",), "remove a member")
    tenant = tenant_of(p, x_tenant)
    ctx = Context(dataclasses.replace(p, tenant=tenant, agent=WORKSPACE), WORKSPACE)
    out = await s.commands.remove_user(ctx, checked_user(user, "user"), wait=wait, erase=erase)
    revoked = await request.app.state.keys.revoke_member(tenant, user)
    return {**out, "revoked_keys": [e["id"] for e in revoked]}


@router.delete("/v1/tenant", status_code=202)
async def remove_tenant(p: Caller, s: Svc, request: Request, wait: bool = True,
                        x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Removes the tenant X-Tenant names, for good: the ledger records the erasure, the keys of
    every agent and member of the tenant are destroyed and every projection purges it (both
    follow the answer: 202), and the tenant's API keys are revoked at once (the deployment's own
    operator key only). `revoked_keys`: the ids of the API keys revoked."""
    check_role(p, ("operator",), "remove a tenant")
    tenant = tenant_of(p, x_tenant)
    ctx = Context(dataclasses.replace(p, tenant=tenant, agent=WORKSPACE), WORKSPACE)
    out = await s.commands.remove_tenant(ctx, wait=wait)
    keys = request.app.state.keys
    revoked = [e for e in await keys.list(tenant) if await keys.revoke(tenant, e["id"]) is not None]
    return {**out, "revoked_keys": [e["id"] for e in revoked]}


@router.post("/v1/users/{user}/restore")
async def restore_user(user: User, p: Caller, s: Svc, wait: bool = True,
                       x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Restores a removed member: keys may be issued to them again and they may grant consent
    again; nothing erased comes back (operator keys; the bootstrap key names the tenant with
    X-Tenant). Until this, a removed member stays removed."""
    check_role(p, ("operator",), "restore a member")
    tenant = tenant_of(p, x_tenant)
    ctx = Context(dataclasses.replace(p, tenant=tenant, agent=WORKSPACE), WORKSPACE)
    return await s.commands.restore_user(ctx, checked_user(user, "user"), wait=wait)


@router.post("/v1/tenant/restore")
async def restore_tenant(p: Caller, s: Svc, wait: bool = True,
                         x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Restores the removed tenant X-Tenant names: keys may be issued in it again; nothing
    erased comes back (the deployment's own operator key only)."""
    check_role(p, ("operator",), "restore a tenant")
    tenant = tenant_of(p, x_tenant)
    ctx = Context(dataclasses.replace(p, tenant=tenant, agent=WORKSPACE), WORKSPACE)
    return await s.commands.restore_tenant(ctx, wait=wait)
