"""The tenant and platform memory view (projections/redis/shared_view.py) follows the projection law:
applied incrementally with redeliveries, filled by a rebuild, it shows the same, which is what the
ledger decided; a tenant's removal drops its conventions and floors and nothing of the platform's
or another tenant's."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from events.commands import (
    PLATFORM,
    WORKSPACE,
    DecideConvention,
    RemovePlatformEntry,
    RemoveTenant,
    RemoveTenantFloor,
    SetPlatformEntry,
    SetTenantFloor,
)
from events.record import Provenance, Source
from events.rules import conventions
from events.rules.ledger import LedgerState, decide, evolve
from projections.redis.record_view import RedisRecords
from projections.redis.shared_view import SharedView
from tests.redis_at import redis_at

T0 = datetime(2026, 12, 1, tzinfo=UTC)
OP = Provenance(source=Source.OPERATOR)
_gens = itertools.count(6_000_000)
_ids = itertools.count()


def _c(cls, tenant, **kw):
    return cls(command_id=f"c{next(_ids)}", tenant=tenant, agent=WORKSPACE, issued_at=T0, provenance=OP, **kw)


def ledger_events() -> list:
    state, events = LedgerState(), []
    cmds = [
        conventions.propose("t", "k1", "Deploys go out on Tuesdays", {"a1", "a2"}, T0),
        conventions.propose("t", "k2", "Standups at nine", {"a1", "a3"}, T0),
        _c(DecideConvention, "t", convention="k1", decision="approve"),
        _c(DecideConvention, "t", convention="k2", decision="reject"),
        conventions.propose("t", "k2", "Standups at nine sharp", {"a4", "a1"}, T0),  # another agent: back
        conventions.propose("t", "k3", "Lunch is at noon", {"a1", "a2"}, T0),
        _c(DecideConvention, "t", convention="k3", decision="reject"),
        conventions.propose("u", "k1", "Deploys go out on Tuesdays", {"b1", "b2"}, T0),
        _c(SetTenantFloor, "t", floor="f1", text="No customer data outside the EU"),
        _c(SetTenantFloor, "t", floor="f2", text="Cite the runbook"),
        _c(SetTenantFloor, "t", floor="f1", text="No customer data outside the EEA"),
        _c(RemoveTenantFloor, "t", floor="f2"),
        _c(SetTenantFloor, "u", floor="f1", text="u's own floor"),
        _c(SetPlatformEntry, PLATFORM, entry="p1", kind="policy", text="No diagnoses"),
        _c(SetPlatformEntry, PLATFORM, entry="d1", kind="default", text="Be brief"),
        _c(SetPlatformEntry, PLATFORM, entry="d2", kind="default", text="Use metric units"),
        _c(RemovePlatformEntry, PLATFORM, entry="d2"),
    ]
    for cmd in cmds:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)
    return events


async def shown(store: RedisRecords) -> dict:
    view = SharedView(store)
    out = {}
    for tenant in ("t", "u"):
        mine = await view.tenant(tenant)
        out[tenant] = ([(c.id, c.text, c.status, c.agents) for c in mine.conventions],
                       [(f.id, f.text) for f in mine.floors])
    out["platform"] = [(e.id, e.kind, e.text) for e in await view.platform()]
    return out


EXPECTED = {
    "t": ([("k1", "Deploys go out on Tuesdays", "approved", ("a1", "a2")),
           ("k2", "Standups at nine sharp", "candidate", ("a1", "a3", "a4")),
           ("k3", "Lunch is at noon", "rejected", ("a1", "a2"))],
          [("f1", "No customer data outside the EEA")]),
    "u": ([("k1", "Deploys go out on Tuesdays", "candidate", ("b1", "b2"))], [("f1", "u's own floor")]),
    "platform": [("d1", "default", "Be brief"), ("p1", "policy", "No diagnoses")],
}


async def test_incremental_with_redeliveries_and_a_rebuild_show_what_the_ledger_decided(settings):
    events = ledger_events()
    inc = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    rebuilt = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        for i in range(0, len(events), 2):
            await inc.apply(events[i:i + 2])
            await inc.apply(events[max(0, i - 3):i + 2])  # a redelivery from an older checkpoint
        await rebuilt.fill(events)
        assert await shown(inc) == EXPECTED
        assert await shown(rebuilt) == EXPECTED
        state = LedgerState()
        [erased] = decide(state, _c(RemoveTenant, "t"))
        await inc.apply([erased])
        after = await shown(inc)
        assert after["t"] == ([], []) and after["u"] == EXPECTED["u"] and after["platform"] == EXPECTED["platform"]
    finally:
        for store in (inc, rebuilt):
            keys = [k async for k in store.r.scan_iter(f"ml:g{store.fixed_generation}:*", count=10_000)]
            if keys:
                await store.r.delete(*keys)
            await store.aclose()
