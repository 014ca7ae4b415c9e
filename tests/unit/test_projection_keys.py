"""The Qdrant projection keeps one agent's parked events apart from another's waits.

Two tenants may send the same command id; an event of one parked for its vector must not
hold the other's read-your-writes wait open.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from events import CommandRejected, RecordAdded, encode
from events.lean import decode_lean
from events.record import MemoryRecord
from projections.qdrant_index import EdgeIndex
from settings import Settings
from workers.qdrant_projection import QdrantProjection, _Batch

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def added(tenant: str, command_id: str, rid: str = "r1"):
    r = MemoryRecord(id=rid, version=1, created=NOW, modified=NOW, tenant=tenant, agent="a", scope="AGENT",
                     kind="fact", summary="a text no vector has arrived for")
    return decode_lean(encode(RecordAdded(event_id="e1", command_id=command_id, tenant=tenant, agent="a",
                                          occurred_at=NOW, record=r)))


async def test_a_parked_event_of_one_tenant_does_not_hold_anothers_wait(tmp_path):
    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0])
    try:
        proj._on_event(added("tb", "idem"), _Batch(), "events:0", 0)
        assert proj.parked  # tb's record waits for its vector
        mine = proj.wait_for("idem", "ta", "a")
        proj._command_done(decode_lean(encode(CommandRejected(event_id="e", command_id="idem", tenant="ta",
                                                              agent="a", occurred_at=NOW, code="X", reason="r"))))
        assert [e.tenant for e in await asyncio.wait_for(mine, 1)] == ["ta"]
        # tb's own wait still waits for its parked event.
        theirs = proj.wait_for("idem", "tb", "a")
        proj._command_done(added("tb", "idem"))
        await asyncio.sleep(0)
        assert not theirs.done()
    finally:
        proj.index.close()


def test_record_keys_share_one_tenant_and_agent_string(tmp_path):
    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0])
    try:
        for n in range(2):
            proj._on_event(added("tenant-" + "x" * 20, f"c{n}", f"r{n}"), _Batch(), "events:0", n)
        keys = list(proj.versions)
        assert len(keys) == 2 and keys[0][0] is keys[1][0] and keys[0][1] is keys[1][1]
    finally:
        proj.index.close()
