"""The Qdrant projection keeps one agent's parked events apart from another's waits.

Two tenants may send the same command id; an event of one parked for its vector must not
hold the other's read-your-writes wait open.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from events import CommandRejected, RecordAdded, encode
from events.codec import PLAIN
from events.lean import decode_lean
from events.record import MemoryRecord
from projections.qdrant.index import EdgeIndex
from settings import Settings
from workers.followers.qdrant_projection import QdrantProjection, _Batch

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def added(tenant: str, command_id: str, rid: str = "r1"):
    r = MemoryRecord(id=rid, version=1, created=NOW, modified=NOW, tenant=tenant, agent="a", scope="AGENT",
                     kind="fact", summary="a text no vector has arrived for")
    return decode_lean(encode(RecordAdded(event_id="e1", command_id=command_id, tenant=tenant, agent="a",
                                          occurred_at=NOW, record=r)))


async def test_a_parked_event_of_one_tenant_does_not_hold_anothers_wait(tmp_path):
    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0], codec=PLAIN)
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
    proj = QdrantProjection(Settings(), EdgeIndex(tmp_path / "shard"), [0], codec=PLAIN)
    try:
        for n in range(2):
            proj._on_event(added("tenant-" + "x" * 20, f"c{n}", f"r{n}"), _Batch(), "events:0", n)
        keys = list(proj.versions)
        assert len(keys) == 2 and keys[0][0] is keys[1][0] and keys[0][1] is keys[1][1]
    finally:
        proj.index.close()


# ---------------------------------------------------------------------------------- Redis Cluster slots
# Every script and every multi-key command or MULTI/EXEC of the Redis adapters keeps its keys in
# one hash slot, so each runs on a Redis Cluster (docs/operations/redis-cluster.md). The keys below are the
# ones the adapters build, and the slot is the one Redis computes (hash tags included).

import pytest  # noqa: E402

from projections.redis.connection import key_slot, tagged  # noqa: E402
from projections.redis.history_view import RedisHistory  # noqa: E402
from projections.redis.record_view import AGENT_KINDS, APPLY_KINDS, agent_key, apply_keys, user_list_key  # noqa: E402
from workers.runtime.heartbeat import heartbeat_key, registry_key, seen_key  # noqa: E402

AGENTS = ["acme/bot", "acme/helpdesk", "t/a", "tenant.x@y/agent:1-2", "b/bot"]


def _one_slot(keys: list[str]) -> int:
    slots = {key_slot(k) for k in keys}
    assert len(slots) == 1, {k: key_slot(k) for k in keys}
    return slots.pop()


@pytest.mark.parametrize("ns", ["ml:g1", "ml:t1796a.g42", "ml:deploy.with.prefix.g7"])
def test_an_agents_apply_script_and_drop_touch_one_slot(ns):
    for ak in AGENTS:
        keys = apply_keys(ns, ak)
        assert keys == [f"{ns}:{kind}:{{{ak}}}" for kind in APPLY_KINDS]
        # APPLY also writes the members' listings, built from this prefix; dropping an agent
        # unlinks all of its keys (and those listings) in one command.
        members = [user_list_key(ns, ak, u) for u in ("ann", "bob", "u:1@x")]
        assert all(m.startswith(agent_key(ns, "ulist", ak) + "|") for m in members)
        slot = _one_slot(keys + members + [agent_key(ns, kind, ak) for kind in (*AGENT_KINDS, "config")])
        assert slot == key_slot(tagged(ak))


def test_the_tag_is_the_agent_not_the_generation_or_deployment():
    """Generations and deployments of one agent share its slot; agents spread over the slots."""
    assert key_slot(agent_key("ml:g1", "rec", "acme/bot")) == key_slot(agent_key("ml:pfx.g99", "list", "acme/bot"))
    assert len({key_slot(agent_key("ml:g1", "rec", f"ten{i}/bot")) for i in range(200)}) > 150


def test_a_batch_of_several_agents_spans_slots_so_it_is_split_per_agent():
    """What the per-agent split is for: one script over two agents' keys would be CROSSSLOT."""
    assert key_slot(agent_key("ml:g1", "rec", "acme/bot")) != key_slot(agent_key("ml:g1", "rec", "acme/helpdesk"))


def test_a_sessions_history_keys_share_the_agents_slot():
    h = RedisHistory(client=None, namespace="t1.", generation=3)  # type: ignore[arg-type]
    for sk in ("acme/bot/s1", "acme/bot/conv:2", "t/a/s"):
        tenant, agent, _ = sk.split("/", 2)
        # A user's erasure removes from both keys in one MULTI/EXEC, and UNLINKs both at once.
        assert _one_slot([h._ev(sk), h._ord(sk)]) == key_slot(tagged(f"{tenant}/{agent}"))
        # Membership windows are read with the events in one pipeline (visible_messages).
        assert key_slot(h._mem(sk)) == key_slot(tagged(f"{tenant}/{agent}"))


def test_heartbeat_keys_share_one_slot():
    """Forgetting a worker is one MULTI/EXEC over the three; /health MGETs every heartbeat."""
    from settings import Settings

    s = Settings(topic_prefix="t9.")
    _one_slot([registry_key(s), seen_key(s), *(heartbeat_key(s, w) for w in ("ledger", "history", "embedding"))])


def test_apply_names_no_key_but_its_keys_and_the_member_listing_prefix():
    """The slot checks above hold for what APPLY touches only if it builds no other key: every
    redis.call's key is one of KEYS (rk .. ek), a member listing (`ulist .. user`), a sorted set
    of its changes (which are those) or, for PUBLISH, the channel."""
    import re

    from projections.redis.record_view import APPLY, CHECKPOINT

    assert "local rk, lk, pk, sk, uk, ek = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]" in APPLY
    assert re.findall(r"local ul = (.+)", APPLY) == ["ulist .. user"]
    assert "local ulist, ak = ARGV[1], ARGV[4]" in APPLY
    calls = re.findall(r"redis\.call\('(\w+)', ([^,)]+)", APPLY)
    assert calls and {key for op, key in calls if op != "PUBLISH"} <= {"rk", "sk", "key", "uk"}
    assert {key for op, key in calls if op == "PUBLISH"} == {"ARGV[2]"}
    assert set(re.findall(r"put\((\w+), rid", APPLY)) == {"lk", "ul", "pk", "ek"}
    assert set(re.findall(r"redis\.call\('\w+', ([^,)]+)", CHECKPOINT)) == {"KEYS[1]"}
