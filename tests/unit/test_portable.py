"""What an import makes of a memlane export or a Mem0 export: one write per live record, the same
command id on every run, and a line naming the field for what it cannot take."""

from __future__ import annotations

import json

from events.rules import portable


def export_text(*records: dict, fmt: str = portable.FORMAT, version: int = portable.VERSION) -> str:
    head = {**portable.header("t", "a", None, "2026-12-06T00:00:00+00:00"), "format": fmt, "version": version}
    return "\n".join(json.dumps(x) for x in (head, *records)) + "\n"


def record(rid: str, *versions: dict) -> dict:
    return {"type": "record", "id": rid, "versions": [
        {"id": rid, "version": i + 1, "tenant": "old", "agent": "src", "status": "ACTIVE", "kind": "fact",
         "scope": "AGENT", "user": None, "summary": f"{rid} v{i + 1}", "content": "", "labels": {}, "tags": [],
         "metadata": {}, "usage_count": 3, **v} for i, v in enumerate(versions)]}


def test_a_memlane_export_writes_each_live_records_newest_version_once():
    text = export_text(record("r1", {}, {"summary": "r1 now", "valid_from": "2026-03-01T00:00:00Z"}),
                       record("r2", {"status": "DELETED"}),
                       {"type": "block", "scope": "agent", "label": "style", "text": "terse"})
    parsed = portable.parse(text, "t", "a")
    assert parsed.kind == "memlane" and not parsed.refused and parsed.skipped == 1
    assert parsed.blocks == [portable.BlockLine(4, "style", "agent", None, "terse")]
    [w] = parsed.writes
    assert w.fields == {"summary": "r1 now", "kind": "fact", "scope": "AGENT", "valid_from": "2026-03-01T00:00:00Z"}
    assert "usage_count" not in w.fields and "id" not in w.fields  # the importing ledger's to set
    again = portable.parse(text, "t", "a")
    assert again.writes[0].command_id == w.command_id  # a second run is the same command
    assert portable.parse(text, "t", "other").writes[0].command_id != w.command_id


def test_another_format_or_a_broken_line_is_refused_naming_where():
    parsed = portable.parse(export_text(record("r1", {}), fmt="something.else"), "t", "a")
    assert [(r.line, r.field) for r in parsed.refused] == [(1, "format")]
    broken = export_text(record("r1", {})) + "{not json\n" + json.dumps({"type": "record", "versions": []}) + "\n"
    parsed = portable.parse(broken, "t", "a")
    assert [(r.line, r.field) for r in parsed.refused] == [(3, "$"), (4, "versions")]
    assert len(parsed.writes) == 1


def test_a_mem0_export_makes_members_memories_and_the_agents():
    doc = {"results": [
        {"id": "m1", "memory": "Likes green tea", "user_id": "alice", "metadata": {"source": "chat"},
         "created_at": "2024-07-20T01:34:02-07:00"},
        {"id": "m2", "memory": "The office closes at six", "agent_id": "a"},
        {"id": "m3", "memory": "Another agent's", "agent_id": "elsewhere"},
        {"id": "m4", "memory": ""},
    ]}
    parsed = portable.parse(json.dumps(doc), "t", "a")
    assert parsed.kind == "mem0"
    alice, office = parsed.writes
    assert (alice.user, alice.fields) == ("alice", {"summary": "Likes green tea", "scope": "USER",
                                                    "metadata": {"source": "chat"},
                                                    "observed_at": "2024-07-20T01:34:02-07:00"})
    assert (office.user, office.fields["scope"]) == (None, "AGENT")
    assert [(r.line, r.field) for r in parsed.refused] == [(3, "agent_id"), (4, "memory")]
    assert portable.parse(json.dumps(doc["results"]), "t", "a").writes == parsed.writes  # a bare list too


def test_a_mem0_document_without_memories_says_what_it_expected():
    parsed = portable.parse(json.dumps({"count": 0}), "t", "a")
    assert not parsed.writes and "results" in parsed.refused[0].reason
