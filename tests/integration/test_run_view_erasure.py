"""The run view in a real Redis, written by the record view's apply and by a rebuild's fill:
an erased member's runs, and every run of an erased agent, leave Redis with the erasure,
not when their keys expire."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime

import pytest

from events import SubjectErased
from events.memory import RunEntryAdded
from projections.redis.record_view import RedisRecords
from projections.redis.run_view import RunView, run_key
from tests.redis_at import redis_at

NOW = datetime.now(UTC)
_gen = itertools.count(1)


@pytest.fixture(params=["apply", "fill"])
async def view(request, settings):
    gen = 9_000_000_000 + int(uuid.uuid4().hex[:6], 16) * 10 + next(_gen) % 10
    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=gen)
    write = store.apply if request.param == "apply" else store.fill
    yield store, write
    keys = [k async for k in store.r.scan_iter(f"ml:g{gen}:*", count=10_000)]
    if keys:
        await store.r.delete(*keys)
    await store.aclose()


def entry(agent: str, run: str, user: str | None) -> RunEntryAdded:
    eid = f"{agent}-{run}-{user or 'none'}"
    return RunEntryAdded(event_id=eid, command_id=f"c-{eid}", tenant="t", agent=agent, occurred_at=NOW, run=run,
                         entry_id=eid, summary=f"entry of {user}", user=user, run_last_write=NOW, starts_run=True)


def erased(agent: str, user: str | None) -> SubjectErased:
    return SubjectErased(event_id=f"x-{agent}-{user}", command_id=f"cx-{agent}-{user}", tenant="t", agent=agent,
                         occurred_at=NOW, user=user)


async def runs(store: RedisRecords) -> set[tuple[str, str, str | None]]:
    """(agent, run, member) of every run the view shows."""
    view, out = RunView(store), set()
    for agent in ("a", "b"):
        for run in ("r1", "r2"):
            for user in ("ann", "bob", None):
                if (await view.read("t", agent, run, NOW, user)).entries:
                    out.add((agent, run, user))
    return out


async def test_an_erasure_drops_the_members_runs_or_every_run_of_the_agent(view):
    store, write = view
    await write([entry(a, run, u) for a in ("a", "b") for run in ("r1", "r2") for u in ("ann", "bob", None)])
    assert len(await runs(store)) == 12
    await write([erased("a", "ann")])
    assert await runs(store) == {(a, r, u) for a in ("a", "b") for r in ("r1", "r2") for u in ("ann", "bob", None)
                                 if (a, u) != ("a", "ann")}
    ns = store._ns(await store._read_generation())
    assert not await store.r.exists(run_key(ns, "t", "a", "r1", "ann"), run_key(ns, "t", "a", "r2", "ann"))
    await write([erased("b", None)])
    assert await runs(store) == {("a", r, u) for r in ("r1", "r2") for u in ("bob", None)}
