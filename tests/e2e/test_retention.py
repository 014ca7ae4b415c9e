"""Retention runs inside memlane (the ledger schedules it): a tombstone older than the
retention period is purged from the ledger and the record view, a newer one stays readable
in its version history, and a live fact is untouched."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events.commands import AddMemory, DeleteMemory
from events.config import AgentConfig
from events.memory import RecordsPurged
from events.rules.ledger.state import record_id_for
from events.topics import EVENTS
from services.client import MemlaneClient, MemlaneError
from tests.conftest import eventually
from tests.e2e.extraction_support import new_agent, read_topic, send_atomically


@pytest.fixture(scope="module")
def rstack(model_stack):
    # The session's model stack: its profile runs retention every 2 s (MEMLANE_RETENTION_EVERY_S).
    return model_stack


def _cmd(cls, tenant, agent, at, **kw):
    return cls(command_id=str(uuid.uuid4()), tenant=tenant, agent=agent, issued_at=at, **kw)


async def test_the_ledger_purges_tombstones_past_the_retention_period(rstack):
    stack, settings = rstack
    config = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, config)
    now = datetime.now(UTC)
    long_ago, lately = now - timedelta(days=200), now - timedelta(days=20)
    old = _cmd(AddMemory, tenant, agent, long_ago, summary="Retention old fact", scope="AGENT")
    new = _cmd(AddMemory, tenant, agent, lately, summary="Retention recent fact", scope="AGENT")
    live = _cmd(AddMemory, tenant, agent, now, summary="Retention live fact", scope="AGENT")
    old_id, new_id = (record_id_for(tenant, agent, c.command_id) for c in (old, new))
    # The writes and the deletions go in one transaction: no retention run falls between them.
    await send_atomically(settings, old, new, live,
                          _cmd(DeleteMemory, tenant, agent, long_ago + timedelta(days=1), record_id=old_id),
                          _cmd(DeleteMemory, tenant, agent, lately + timedelta(days=1), record_id=new_id))
    async with MemlaneClient(stack.api_url, key) as c:
        async def purged():
            events = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
                      if isinstance(e, RecordsPurged) and e.agent == agent]
            return events or None

        [event] = await eventually(purged, timeout=60)
        assert event.record_ids == [old_id]

        async def gone():
            try:
                await c.read_memory(old_id)
            except MemlaneError as e:
                return e.status == 404
            return False

        await eventually(gone, timeout=30)
        recent = await c.history(new_id)
        # Within the period: still readable in its version history.
        assert sorted(v.status.value for v in recent) == ["ACTIVE", "DELETED"]
        assert [r["summary"] for r in (await c.list_memory())["records"]] == ["Retention live fact"]
