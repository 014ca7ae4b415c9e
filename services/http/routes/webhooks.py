"""Webhooks, registered by a tenant's operator: `memory.changed` and `subject.erased` delivered to
its endpoints, signed, by the delivery worker (`workers.followers.webhook_delivery`); deliveries that
kept failing are listed and sent again here. Registrations live in the log, not in Redis."""

from __future__ import annotations

import asyncio
import secrets
import socket
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from events.base import Ident
from events.errors import ErrorCode
from events.rules.webhooks import url_refusal
from events.topics import WEBHOOKS, WEBHOOKS_DEAD
from events.webhooks import KINDS, Kind, WebhookParked, WebhookRegistered, WebhookRemoved, WebhookReplayed
from services.errors import ApiError
from services.http.deps import Caller
from services.http.models import Body
from services.http.routes.keys import tenant_operator
from workers.followers.webhook_delivery import sealed_secret
from workers.runtime.topic_reader import TopicReader

router = APIRouter()
TenantQuery = Annotated[str | None, Query(max_length=128)]


class WebhookRequest(Body):
    url: Annotated[str, Field(max_length=2000)]
    events: Annotated[list[Kind], Field(min_length=1, max_length=len(KINDS))]
    agent: Ident | None = None  # only this agent's events
    # `memory.changed` with the record's summary and content; never those of a member's facts.
    include_text: bool = False


class ReplayRequest(Body):
    delivery_ids: Annotated[list[str], Field(max_length=1000)] | None = None  # None: every parked delivery


def _resolve(host: str) -> list[str]:
    return sorted({str(a[4][0]) for a in socket.getaddrinfo(host, None)})


async def _read(request: Request, topic: str) -> list[Any]:
    settings, codec = request.app.state.settings, request.app.state.codec
    from aiokafka import TopicPartition

    async with TopicReader(settings) as reader:
        msgs = await reader.read_all([TopicPartition(settings.topic(topic), 0)])
    return [codec.decode(topic, m.value) for m in msgs if m.value]


async def _send(request: Request, topic: Any, msg: Any) -> None:
    settings, codec = request.app.state.settings, request.app.state.codec
    if (keys := request.app.state.data_keys) is not None:
        await keys.flush()  # a secret sealed under a key made just now: the key goes first
    await request.app.state.producer.send_and_wait(settings.topic(topic.name), codec.encode(msg),
                                                   key=topic.key_bytes(msg))


async def _registered(request: Request, tenant: str) -> dict[str, WebhookRegistered]:
    latest: dict[str, Any] = {}
    for msg in await _read(request, WEBHOOKS.name):
        if msg.tenant == tenant:
            latest[msg.webhook_id] = msg
    return {k: v for k, v in latest.items() if isinstance(v, WebhookRegistered)}


def _out(w: WebhookRegistered) -> dict[str, Any]:
    return {"id": w.webhook_id, "url": w.url, "events": w.events, "agent": w.agent,
            "include_text": w.include_text, "registered_at": w.registered_at.isoformat()}


@router.post("/v1/admin/webhooks", status_code=201)
async def register_webhook(body: WebhookRequest, p: Caller, request: Request, tenant: TenantQuery = None):
    """Registers an endpoint; the answer shows its signing secret, this once."""
    tenant = tenant_operator(p, tenant, "register webhooks")
    refusal = await asyncio.to_thread(url_refusal, body.url, request.app.state.settings.dev, _resolve)
    if refusal is not None:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "url", refusal, 422)
    wid, secret = uuid.uuid4().hex[:16], secrets.token_urlsafe(32)
    msg = WebhookRegistered(tenant=tenant, webhook_id=wid, url=body.url, events=body.events, agent=body.agent,
                            include_text=body.include_text, secret=sealed_secret(request.app.state.codec, tenant, wid, secret),
                            registered_at=datetime.now(UTC))
    await _send(request, WEBHOOKS, msg)
    return {**_out(msg), "secret": secret}


@router.get("/v1/admin/webhooks")
async def list_webhooks(p: Caller, request: Request, tenant: TenantQuery = None):
    tenant = tenant_operator(p, tenant, "list webhooks")
    return {"webhooks": [_out(w) for w in (await _registered(request, tenant)).values()]}


@router.delete("/v1/admin/webhooks/{webhook_id}")
async def remove_webhook(webhook_id: Annotated[str, Path(max_length=64)], p: Caller, request: Request,
                         tenant: TenantQuery = None):
    tenant = tenant_operator(p, tenant, "remove webhooks")
    if webhook_id not in await _registered(request, tenant):
        raise ApiError(ErrorCode.NOT_FOUND, "webhook_id", f"no webhook {webhook_id} in this tenant; list them with "
                       "GET /v1/admin/webhooks", 404)
    await _send(request, WEBHOOKS, WebhookRemoved(tenant=tenant, webhook_id=webhook_id, removed_at=datetime.now(UTC)))
    return {"removed": webhook_id}


async def _parked(request: Request, tenant: str) -> dict[str, WebhookParked]:
    parked: dict[str, WebhookParked] = {}
    for msg in await _read(request, WEBHOOKS_DEAD.name):
        if msg.tenant != tenant:
            continue
        if isinstance(msg, WebhookParked):
            parked[msg.delivery_id] = msg
        elif isinstance(msg, WebhookReplayed):
            for did in msg.delivery_ids:
                parked.pop(did, None)
    return parked


@router.get("/v1/admin/webhooks/dead")
async def dead_deliveries(p: Caller, request: Request, tenant: TenantQuery = None):
    """Deliveries parked after their last attempt and not sent again since."""
    tenant = tenant_operator(p, tenant, "list webhook dead letters")
    return {"deliveries": [{"delivery_id": d.delivery_id, "webhook_id": d.webhook_id, "type": d.kind,
                            "attempts": d.attempts, "error": d.error, "parked_at": d.parked_at.isoformat()}
                           for d in (await _parked(request, tenant)).values()]}


@router.post("/v1/admin/webhooks/dead/replay")
async def replay_deliveries(body: ReplayRequest, p: Caller, request: Request, tenant: TenantQuery = None):
    """Sends parked deliveries again (all, or those named), with their ids: a receiver that got one drops it."""
    tenant = tenant_operator(p, tenant, "replay webhook deliveries")
    parked = await _parked(request, tenant)
    ids = list(parked) if body.delivery_ids is None else body.delivery_ids
    unknown = [d for d in ids if d not in parked]
    if unknown:
        raise ApiError(ErrorCode.NOT_FOUND, "delivery_ids", f"delivery_ids: {unknown[0]} is not parked in this "
                       "tenant; list them with GET /v1/admin/webhooks/dead", 404)
    if ids:
        await _send(request, WEBHOOKS_DEAD, WebhookReplayed(tenant=tenant, delivery_ids=ids,
                                                            replayed_at=datetime.now(UTC)))
    return {"replayed": len(ids)}
