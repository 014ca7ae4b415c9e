"""Webhook registrations (`memlane.webhooks`, compacted by tenant/id) and deliveries that kept
failing (`memlane.webhooks.dead`): the log holds both, so a restart or a lost Redis loses neither."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from events.base import Ident, Message_

Kind = Literal["memory.changed", "turn.processed", "subject.erased"]
KINDS: tuple[str, ...] = ("memory.changed", "turn.processed", "subject.erased")


class WebhookRegistered(Message_):
    type: Literal["WebhookRegistered"] = "WebhookRegistered"
    tenant: Ident
    webhook_id: Ident
    url: str
    events: list[Kind]
    agent: Ident | None = None  # only this agent's events; None: every agent of the tenant
    # `memory.changed` carries the summary and content of a record written, except a member's.
    include_text: bool = False
    # The signing secret, sealed under the tenant's workspace key when the deployment encrypts.
    secret: str
    registered_at: datetime


class WebhookRemoved(Message_):
    type: Literal["WebhookRemoved"] = "WebhookRemoved"
    tenant: Ident
    webhook_id: Ident
    removed_at: datetime


class WebhookParked(Message_):
    """A delivery that kept failing: what was sent, and why it failed last."""

    type: Literal["WebhookParked"] = "WebhookParked"
    tenant: Ident
    webhook_id: Ident
    delivery_id: str
    kind: str
    body: str
    attempts: int
    error: str
    parked_at: datetime


class WebhookReplayed(Message_):
    """The operator sent parked deliveries again (the delivery worker does)."""

    type: Literal["WebhookReplayed"] = "WebhookReplayed"
    tenant: Ident
    delivery_ids: list[str]
    replayed_at: datetime


Registration = Annotated[WebhookRegistered | WebhookRemoved, Field(discriminator="type")]
DeadLetter = Annotated[WebhookParked | WebhookReplayed, Field(discriminator="type")]
