"""Read-your-writes across serve replicas: positions in the event log, as response headers
and read fences.

Every replica folds the same log into its own copy of the memory index, so what one replica
has indexed another has, or will within milliseconds. A response that names an agent carries
`X-Memlane-Position: <partition>:<offset>`, the point of that agent's event partition before
which this replica serves everything; a request that sends a position back in
`X-Memlane-After` (one or more, comma-separated) is answered only once this replica has
reached it, whichever replica wrote. Kafka Streams bounds its interactive queries the same
way (a position per partition). The reasoning and the figures: docs/operations/serve-replicas.md.
"""

from __future__ import annotations

import contextvars
from typing import Any

from events.errors import ErrorCode
from events.topics import EVENTS
from services.errors import ApiError

POSITION, AFTER = "x-memlane-position", "x-memlane-after"
FENCE_S = 5.0  # a replica further behind than this answers 503, and the client tries another
_agent: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("memlane_agent", default=None)


def parse_after(value: str) -> dict[int, int]:
    """`p:o[,p:o…]` as {partition: offset}; the highest offset wins for a repeated partition."""
    out: dict[int, int] = {}
    for item in value.split(","):
        p, sep, o = item.strip().partition(":")
        if not (sep and p.isdigit() and o.isdigit() and int(p) < EVENTS.partitions and len(o) <= 19):
            raise ApiError(ErrorCode.VALIDATION_FAILED, AFTER, f"{AFTER}: positions are <partition>:<offset> "
                           f"(partition 0 to {EVENTS.partitions - 1}), comma-separated, as {POSITION} gave them", 422)
        out[int(p)] = max(out.get(int(p), 0), int(o))
    return out


async def fence(shards: Any, tenant: str, agent: str, after: str | None) -> None:
    """Holds a request until this replica serves the agent's partition up to the position
    the caller saw elsewhere; notes the agent, so the response tells its position."""
    noted = _agent.get()
    if noted is not None:
        noted.update(shards=shards, tenant=tenant, agent=agent)
    if not after:
        return
    partition = EVENTS.partition_of(f"{tenant}/{agent}".encode())
    offset = parse_after(after).get(partition)
    if offset is not None and not await shards.reach(tenant, agent, offset, FENCE_S):
        raise ApiError(ErrorCode.UNAVAILABLE, AFTER, f"this replica has not yet indexed the agent's memory up to "
                       f"{partition}:{offset} within {FENCE_S:g} s; retry, or send the request to another replica", 503)


class Positions:
    """ASGI middleware: adds `X-Memlane-Position` to the response of a request that named an
    agent, read when the response starts (after a write it waited for was indexed)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        noted: dict[str, Any] = {}
        token = _agent.set(noted)

        async def send_with_position(message: dict) -> None:
            if message["type"] == "http.response.start" and "shards" in noted:
                partition, offset = noted["shards"].position(noted["tenant"], noted["agent"])
                message = {**message, "headers": [*message.get("headers", []),
                                                  (POSITION.encode(), f"{partition}:{offset}".encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_position)
        finally:
            _agent.reset(token)
