"""What a webhook is told, and how: the notices an event of the log makes, each delivery's id and
signature, and which endpoint URLs are refused.

A delivery's id names the event by its place in the log and the webhook it goes to, so a replay,
a restart or a second worker sends a notice again with the same id (the receiver drops the copy).
The signature is HMAC-SHA256 of `<timestamp>.<body>` under the webhook's secret.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Record events, and what happened to the record in each.
ACTIONS = {"RecordAdded": "added", "RecordSuperseded": "replaced", "RecordDeleted": "deleted",
           "RecordExpired": "expired", "RecordRestored": "restored", "RecordRevised": "revised",
           "RecordPinned": "pinned", "RecordUnpinned": "unpinned"}


@dataclass(frozen=True)
class Notice:
    kind: str
    tenant: str
    agent: str
    data: dict[str, Any]


def notices(event: Any) -> list[Notice]:
    """What `event` (a lean event of the log, a full one, or a usage record) tells webhooks: ids,
    kinds and counts, never text."""
    action = ACTIONS.get(event.type)
    if action is not None and event.record is not None:
        r = event.record
        scope = getattr(r.scope, "value", r.scope)
        return [Notice("memory.changed", event.tenant, event.agent, {
            "action": action, "record_id": r.id, "version": r.version, "kind": r.kind, "scope": scope,
            **({"user": r.user} if r.user else {}), **({"session": r.session} if r.session else {})})]
    if event.type in ("TurnReviewed", "MemorySkipped") and event.turn is not None:
        return [turn_processed(event)]
    if event.type == "SubjectErased":
        return [Notice("subject.erased", event.tenant, event.agent, {
            "agent": None if getattr(event, "tenant_wide", False) else event.agent,
            **({"user": event.user} if event.user else {})})]
    return []


TEXT_ACTIONS = ("added", "replaced", "revised", "restored")  # the actions whose record has text to tell


def text_to_tell(notice: Notice, record: Any) -> bool:
    """Whether a `memory.changed` notice may carry `record`'s text to an endpoint that asked for it:
    a record written, and not a member's (whose facts no operator reads)."""
    return notice.kind == "memory.changed" and notice.data["action"] in TEXT_ACTIONS and record.user is None


def with_text(notice: Notice, record: Any) -> Notice:
    """`notice` with the summary and content of `record` (opened)."""
    return Notice(notice.kind, notice.tenant, notice.agent,
                  {**notice.data, "summary": record.summary, "content": record.content})


def turn_processed(usage: Any) -> Notice:
    """A turn's review finished (`TurnReviewed`), or the turn got none and why (`MemorySkipped`)."""
    data: dict[str, Any] = {"session": usage.session, "turn": usage.turn,
                            **({"user": usage.user} if usage.user else {})}
    if usage.type == "MemorySkipped":
        data.update(reviewed=False, reason=usage.reason)
    else:
        decided = [d.model_dump(exclude_none=True, exclude={"schema_version"}) for d in usage.decided]
        data.update(reviewed=True, decided=decided,
                    skipped=usage.skipped, refused=usage.refused)
    return Notice("turn.processed", usage.tenant, usage.agent, data)


def delivery_id(webhook_id: str, partition: int, offset: int, kind: str) -> str:
    return hashlib.sha256(f"{webhook_id}\0{partition}\0{offset}\0{kind}".encode()).hexdigest()[:32]


def body_of(delivery: str, notice: Notice, at: str) -> str:
    return json.dumps({"id": delivery, "type": notice.kind, "created_at": at, "tenant": notice.tenant,
                       "agent": notice.agent, "data": notice.data}, separators=(",", ":"))


def signature(secret: str, timestamp: int, body: str) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"v1={mac}"


def url_refusal(url: str, dev: bool, resolve: Callable[[str], list[str]]) -> str | None:
    """Why `url` cannot be an endpoint, or None. Outside development mode an endpoint must not
    resolve to a loopback, link-local or unspecified address (a webhook is not a way into the
    deployment's own network)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "url: an http or https URL with a host, such as https://example.com/hooks/memlane"
    if dev:
        return None
    try:
        addresses = resolve(parts.hostname)
    except OSError:
        return f"url: {parts.hostname} does not resolve; give a host this deployment can reach"
    for a in addresses:
        ip = ipaddress.ip_address(a)
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
            return f"url: {parts.hostname} resolves to {a}, a loopback or link-local address; webhooks go to other hosts"
    return None
