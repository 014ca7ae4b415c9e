"""Memory search: one search, or up to 100 in one request (benchmarked: answers skip FastAPI's encoder).

Agent and helper keys search; a member key never does (members have no search), it lists its own facts.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header
from pydantic import Field

from events.base import utcnow
from events.errors import ErrorCode
from events.rules.trust import breakdown
from services.auth import Principal
from services.errors import ApiError
from services.http.deps import Caller, Ctx, Svc, checked_channel, checked_user, resolve_context
from services.http.errors import api_error_item
from services.http.models import Body, PastPoint
from services.http.responses import FastJSONResponse, record_out
from services.memory import Context
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()


class SearchFields(Body):
    query: Annotated[str, Field(max_length=4000)] | None = None
    kind: str | None = None
    labels: dict[str, str] = {}
    tags: Annotated[list[str], Field(max_length=20)] = []  # records holding every one of them
    ids: Annotated[list[str], Field(max_length=100)] = []
    limit: Annotated[int, Field(ge=1, le=100)] | None = None
    after: str | None = None
    mode: Literal["hybrid", "lexical", "vector"] | None = None
    min_score: Annotated[float, Field(ge=-1, le=1)] | None = None


class SearchRequest(SearchFields):
    as_of: PastPoint = None


class SearchItem(SearchFields):
    # Whose memory the search reads: the X-Tenant, X-Agent, X-Session, X-Preview, X-User and
    # X-Channel headers of a single search, given per item (the request's headers when left out).
    tenant: str | None = None
    agent: str | None = None
    session: str | None = None
    preview: bool | None = None
    user: str | None = None
    channel: str | None = None


class SearchBatchRequest(Body):
    searches: Annotated[list[SearchItem], Field(min_length=1, max_length=100)]
    # A RETRIEVED use is an agent's search whose records reached its model. The extraction
    # worker's review lookups never reach the agent's model (they are shown to the review's,
    # and the proposals record the handles shown), so it turns this off; only an operator
    # key may, so an agent cannot hide its own retrievals.
    retrieved: bool = Field(True, description="record each search as the agent's RETRIEVED use; "
                                              "false (operator keys only) for lookups that never reach the agent's model")


NO_SEARCH = "search memory"


@router.post("/v1/memory/search")
async def search_memory(body: SearchRequest, ctx: Ctx, s: Svc):
    check_role(ctx, NOT_MEMBER, NO_SEARCH)
    fields = body.model_dump(exclude={"as_of"})
    if body.as_of is not None:  # a search of the past shows what was: no use is recorded
        reads = await s.reads_at(ctx, body.as_of, ranked=True)
        res = await reads.search(ctx, **fields)
        now = reads.now()
    else:
        res = await s.reads.search(ctx, **fields)
        await s.usage.retrieved(ctx, "search_memory", [r for r, _ in res.records])
        now = utcnow()
    return FastJSONResponse({"records": [hit_out(r, sc, now) for r, sc in res.records], "next_cursor": res.next_cursor})


@router.post("/v1/memory/search/batch")
async def search_memory_batch(
    body: SearchBatchRequest,
    p: Caller,
    s: Svc,
    x_agent: Annotated[str | None, Header()] = None,
    x_tenant: Annotated[str | None, Header()] = None,
    x_session: Annotated[str | None, Header()] = None,
    x_preview: Annotated[bool, Header()] = False,
    x_user: Annotated[str | None, Header()] = None,
    x_channel: Annotated[str | None, Header()] = None,
):
    """Up to 100 searches in one request, each answered as `/v1/memory/search` would
    answer it alone (same key rules, same usage records), or with its own error.

    For callers that search for many contexts at once (the extraction worker): the HTTP round
    trips collapse into one, and each tenant's queries are embedded in its turn, a few per
    embedder call (docs/features/fairness.md). A tenant with too many queries waiting gets its items
    refused with 429 (`retry_after` in each), the whole request 429 when that is every item.

    The deployment's own operator key (the workers', from settings) with `retrieved: false`
    naming a member (`user`: the extraction worker reviewing that member's turn) reads what the
    agent reads for that member: their user-scope facts with the agent's, under the agent's
    rules (consent, channel, removal). A tenant's operator keys, and any other operator search,
    never show a member's facts.
    """
    check_role(p, NOT_MEMBER, NO_SEARCH)
    if not body.retrieved and p.role != "operator":
        raise ApiError(ErrorCode.FORBIDDEN, "retrieved", "retrieved: only an operator key may set it to false", 403)
    searches: list[tuple[Context, dict[str, Any]]] = []
    answers: list[dict[str, Any] | None] = []
    for item in body.searches:
        try:
            # An item's own member and channel are refused under the item's field names.
            checked_user(item.user, "user")
            checked_channel(item.channel, "channel")
            ctx = resolve_context(
                p,
                item.agent or x_agent,
                item.tenant or x_tenant,
                item.session if item.session is not None else x_session,
                item.preview if item.preview is not None else x_preview,
                x_user=item.user if item.user is not None else x_user,
                x_channel=item.channel if item.channel is not None else x_channel,
            )
        except ApiError as e:
            answers.append(api_error_item(e))
            continue
        if deployment_key(p) and not body.retrieved and ctx.user is not None:
            ctx = as_agent(ctx)
        searches.append((ctx, item.model_dump(exclude={"tenant", "agent", "session", "preview", "user", "channel"})))
        answers.append(None)
    # A lookup that never reaches the agent's model looks up records like a candidate fact: a
    # time the fact names ("went camping last week") must not rank that week's records first.
    found = await s.reads.search_many(searches, named_times=body.retrieved)
    limited = [r for r in found if isinstance(r, ApiError) and r.code == ErrorCode.RATE_LIMITED]
    if limited and len(limited) == len(body.searches):
        raise limited[0]  # nothing of it was done: 429 and Retry-After for the whole request
    results = iter(found)
    ctxs = iter(searches)
    for i, a in enumerate(answers):
        if a is not None:
            continue
        res, (ctx, _) = next(results), next(ctxs)
        if isinstance(res, ApiError):
            answers[i] = api_error_item(res)
            continue
        if body.retrieved:
            await s.usage.retrieved(ctx, "search_memory", [r for r, _ in res.records])
        now = utcnow()
        answers[i] = {"records": [hit_out(r, sc, now) for r, sc in res.records], "next_cursor": res.next_cursor}
    return FastJSONResponse({"results": answers})


def hit_out(r: Any, score: float | None, now: Any) -> dict[str, Any]:
    """A search hit: the record, its score, and its trust breakdown (docs/features/trust.md), which
    explains the record and ranks nothing."""
    return {**record_out(r, score), "trust": breakdown(r, now)}


def deployment_key(p: Principal) -> bool:
    """The bootstrap operator key of settings (`Principal.deployment`, which only the key
    store sets, for that key). A tenant's admins hold issued operator keys, which never read
    a member's facts."""
    return p.role == "operator" and p.deployment


def as_agent(ctx: Context) -> Context:
    """An operator's review lookup for a member, read as the agent reads for that member."""
    return dataclasses.replace(ctx, principal=Principal(ctx.tenant, ctx.agent, "agent", ctx.principal.key_id))
