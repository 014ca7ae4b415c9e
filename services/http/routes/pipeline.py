"""GET /v1/admin/pipeline: the pipeline's status for operators (services.pipeline_status).

A tenant's operator key gets its tenant's activity, and the dead-letter topics' sizes but not
their messages' headers: a dead-letter topic spans tenants. The deployment's own operator key
gets the headers too, and every tenant's activity unless it names one (`?tenant=` or X-Tenant).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from events.errors import ErrorCode
from services.errors import ApiError
from services.http.deps import Caller, tenant_of
from services.memory.rules import check_role
from services.pipeline_status import pipeline_status

router = APIRouter(tags=["admin"])


@router.get("/v1/admin/pipeline")
async def pipeline(p: Caller, request: Request, tenant: Annotated[str | None, Query(max_length=128)] = None,
                   x_tenant: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """Workers (alive, consumer lag), dead-letter topics (size; the first messages' headers for
    the deployment's key), the memory projection, the model configuration (no secrets) and the
    last hour's turns, extraction decisions and recalls per minute. `errors` lists what could
    not be read in time."""
    check_role(p, ("operator",), "read the pipeline's status")
    named = tenant or x_tenant
    if not p.deployment and named not in (None, p.tenant):
        raise ApiError(ErrorCode.FORBIDDEN, "tenant", "an operator key reads its own tenant's activity", 403)
    scope = tenant_of(p, named) if (named or not p.deployment) else None
    s = request.app.state
    return await pipeline_status(s.settings, s.health, s.shards, getattr(s, "activity", None), scope, p.deployment)
