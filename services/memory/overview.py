"""What an operator's overview of a tenant shows: its agents with their configuration, and per
agent how many records it holds by status, kind and scope, its blocks, episodes and procedures.
Counts only: a member's facts are counted, never shown."""

from __future__ import annotations

from typing import Any

from events.rules.ledger import RESERVED_KINDS
from services.memory.context import Context
from services.memory.rules import check_role


async def agents(service: Any, tenant: str) -> list[dict[str, Any]]:
    """The tenant's configured agents, by name, with their configuration."""
    names = await service.records.agents(tenant)
    configs = [await service.records.config(tenant, a) for a in names]
    return [{"agent": a, "config": c.model_dump(mode="json")} for a, c in zip(names, configs, strict=True) if c]


async def overview(service: Any, ctx: Context, records: Any = None) -> dict[str, Any]:
    """One agent: counts by status, kind and scope; blocks (label and size); episodes and
    procedures live; members with their fact counts and consent (operator keys). `records`: the
    record view to count (memory as of a past point, `past.PastView`); the live one by default."""
    check_role(ctx, ("operator",), "see an agent's overview")
    census = await (records or service.records).census(ctx.tenant, ctx.agent)
    by_status: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_scope: dict[str, int] = {}
    live_reserved = dict.fromkeys(RESERVED_KINDS, 0)
    for (status, kind, scope), n in sorted(census.items()):
        by_status[status] = by_status.get(status, 0) + n
        by_kind[kind] = by_kind.get(kind, 0) + n
        by_scope[scope] = by_scope.get(scope, 0) + n
        if kind in live_reserved and status == "ACTIVE":
            live_reserved[kind] += n
    blocks = await service.reads.blocks(ctx)
    return {
        "agent": ctx.agent,
        "records": sum(census.values()),
        "by_status": by_status,
        "by_kind": by_kind,
        "by_scope": by_scope,
        "episodes": live_reserved["episode"],
        "procedures": live_reserved["procedure"],
        "blocks": [{"scope": scope, "label": label, "chars": len(text)} for scope, label, text, _ in blocks],
        "subjects": await service.reads.subjects(ctx),
    }
