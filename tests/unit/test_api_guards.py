"""Pure rules of the API surface: which bodies are refused before routing, what /health
concludes from what it saw, and the MCP server's reply to a line the SDK cannot take."""

from __future__ import annotations

import json

from services.http.health_probe import Observed, assess
from services.http.input_guard import MAX_BODY_BYTES, body_refusal, unencodable_field
from services.mcp_server import refusal


def test_a_lone_surrogate_is_named_by_its_field_and_pairs_pass():
    assert unencodable_field({"labels": {"a": "ok", "b": "x\ud800"}}) == "labels.b"
    assert unencodable_field({"metadata": {"k": [1, {"deep": "\udfff"}]}}) == "metadata.k.1.deep"
    assert unencodable_field({"labels": {"\ud800": "v"}}) == "labels"
    assert unencodable_field({"query": "emoji \U0001F600"}) is None
    assert body_refusal(b'{"q": "\\ud83d\\ude00"}') is None  # an escaped pair is one character
    status, field, message = body_refusal(b'{"tenant": "\\ud800"}')
    assert (status, field) == (422, "tenant") and "UTF-8" in message


def test_bodies_over_the_limit_are_refused_and_depth_does_not_exhaust_the_walk():
    assert body_refusal(b"x" * (MAX_BODY_BYTES + 1))[0] == 413
    deep: dict = {"leaf": "\ud800"}
    for _ in range(5000):
        deep = {"n": deep}
    assert unencodable_field(deep).endswith(".leaf")


def test_health_degrades_for_a_dead_or_lagging_worker_and_a_stopped_task():
    seen = Observed(beats={"ledger": None, "embedding": {"group": "g"}, "history": {"group": "h"}},
                    lags={"embedding": 50_001, "history": 3})
    workers, problems = assess(seen, max_lag=50_000, tasks={"memory projection": False, "history projection": True})
    assert workers["ledger"] == {"alive": False, "lag": None} and workers["history"] == {"alive": True, "lag": 3}
    assert [p.split(":")[0] for p in problems] == ["worker embedding", "worker ledger", "memory projection"]
    assert assess(Observed(beats={"history": {"group": "h"}}, lags={"history": 0}), 10, {"x": True})[1] == []


def test_the_mcp_server_answers_a_line_it_cannot_take():
    bad = '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"arguments": {"q": "\\ud800"}}}'
    reply = json.loads(refusal(bad).model_dump_json())
    assert reply["id"] == 7 and "lone surrogate" in reply["error"]["message"]
    assert json.loads(refusal("not json").model_dump_json())["id"] is None
    assert refusal('{"jsonrpc": "2.0", "method": "notifications/x", "params": {"a": "\\ud800"}}') is None
