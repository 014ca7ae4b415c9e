"""The API fuzz, shared by the e2e test and the bench: schemathesis on every operation of
the served OpenAPI document (its health checks on), then hypothesis strategies that put
hostile values into every operation: lone surrogates, NaN and infinities, deep nesting,
huge strings, NaN cursors and odd headers. Returns how many requests went out and how many
answered 5xx."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import requests
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st

from events import AgentConfig

TENANT, AGENT = "fuzz", "fuzzer"
RAW_INVALID_UTF8 = "%ED%A0%80"  # a surrogate's UTF-8-like bytes, sent as they are
SURROGATES = ["\ud800", "a\udfffb", "\udc80x", "ok\ud83d"]
NUMBERS = [float("nan"), float("inf"), float("-inf"), 1e308, -1, 2**63, 0.5]
# Authorization values with bytes a latin-1 header carries but no key has.
AUTHS = ["Bearer \u00e9\u00ff", "Bearer ml_a_\u00e9", "\u00ff\u00fe", "Bearer " + "k" * 5000, "Basic x"]
ODD_HEADERS = [
    ("X-Agent", "\u00e9\u00e8"), ("X-Tenant", "\u00ff"), ("X-Turn", "NaN"), ("X-Turn", "1e999"),
    ("X-Turn", "-1"), ("X-Turn", str(2**70)), ("X-Preview", "maybe"), ("X-Session", "s" * 4000),
    ("X-Session", "\u00e9"), ("X-Turn-Ref", "r" * 5000), ("X-Execution-Id", "\u00ff" * 10),
]


def nan_cursor() -> str:
    return base64.urlsafe_b64encode(b'[NaN, "x"]').decode().rstrip("=")


@dataclass
class FuzzCounts:
    requests: int = 0
    server_errors: int = 0
    # (method, path, status, what was sent) of the first distinct 5xx, to reproduce them.
    examples: list[tuple[str, str, int, str]] = field(default_factory=list)

    def count(self, method: str, path: str, status: int, sent: str) -> None:
        """`status` 0: the server dropped the connection without an answer, which counts as a 5xx."""
        self.requests += 1
        if status >= 500 or status == 0:
            self.server_errors += 1
            seen = {(m, p, w) for m, p, _, w in self.examples}
            if len(self.examples) < 20 and (method, path, sent[:300]) not in seen:
                self.examples.append((method, path, status, sent[:300]))

    def as_figures(self) -> dict[str, int]:
        return {"fuzz_requests": self.requests, "fuzz_5xx": self.server_errors}


def _prepare(api_url: str, operator_key: str) -> str:
    """The agent key the fuzz speaks with, its agent configured with every tool."""
    tools = ["add_memory", "read_memory", "delete_memory", "pin_memory", "unpin_memory", "curate_block",
             "report_outcome"]
    config = AgentConfig.model_validate({"memory": {"tools": tools}}).model_dump(mode="json")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {operator_key}"}, timeout=60) as op:
        r = op.post("/v1/admin/keys", json={"tenant": TENANT, "agent": AGENT})
        r.raise_for_status()
        op.put("/v1/config", headers={"X-Tenant": TENANT, "X-Agent": AGENT}, json=config).raise_for_status()
        return r.json()["key"]


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every place in a JSON body a value can go (each key's value, list items)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_leaves(v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_leaves(v, (*path, i)))
    return out


def _put(body: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return body


def _nested(depth: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(depth):
        node = {"n": node}
    return node


HOSTILE = st.one_of(
    st.sampled_from(SURROGATES).map(lambda s: ("text", s)),
    st.sampled_from(SURROGATES).map(lambda s: ("key", s)),
    st.sampled_from(NUMBERS).map(lambda n: ("text", n)),
    st.integers(200, 700).map(lambda d: ("text", _nested(d))),
    st.sampled_from([10_000, 300_000, 1_100_000, 2_500_000]).map(lambda n: ("text", "m" * n)),
    st.just(("text", nan_cursor())),
)


def _hostile_request(case: Any, data: st.DataObject, key: str, operator_key: str) -> tuple[dict, str]:
    """One request: the case as schemathesis made it, then a hostile value in its body, its
    query or its headers."""
    headers = {"Authorization": f"Bearer {key}", "X-Session": "fuzz"}
    if data.draw(st.booleans(), label="operator"):
        headers = {"Authorization": f"Bearer {operator_key}", "X-Tenant": TENANT, "X-Agent": AGENT, "X-Session": "fuzz"}
    query = {k: v for k, v in (case.query or {}).items()}
    # A copy of a JSON body; None when the operation has none (schemathesis' NotSet).
    body = json.loads(json.dumps(case.body)) if isinstance(case.body, dict | list | str | int | float) else None
    where = data.draw(st.sampled_from(["body", "query", "header", "auth"]), label="where")
    what = ""
    if where == "auth":
        headers["Authorization"] = data.draw(st.sampled_from(AUTHS), label="auth")
        what = "authorization"
    elif where == "header":
        name, value = data.draw(st.sampled_from(ODD_HEADERS), label="header")
        headers[name] = value
        what = f"header {name}"
    elif where == "query":
        name = data.draw(st.sampled_from(sorted(query) + ["after", "first", "tenant", "version", "wait"]),
                         label="param")
        # A query string carries UTF-8 bytes, never a lone surrogate: send the bytes a client would.
        query[name] = data.draw(st.sampled_from([nan_cursor(), "NaN", "-inf", "1e999", "x" * 20_000, RAW_INVALID_UTF8]),
                                label="value")
        what = f"query {name}"
    else:
        kind, value = data.draw(HOSTILE, label="hostile")
        if not isinstance(body, dict):
            body = {}
        path = data.draw(st.sampled_from(_leaves(body)), label="path")
        if kind == "key":
            target = body
            for p in path:
                target = target[p] if isinstance(target, dict | list) else target
            if isinstance(target, dict):
                target[value] = "v"
            else:
                body = _put(body, path, {value: "v"})
        else:
            body = _put(body, path, value)
        what = f"body {'.'.join(map(str, path)) or '(root)'} {kind}"
    return {"headers": headers, "params": query, "body": body}, what


def known_cases(key: str, operator_key: str) -> list[tuple[str, str, dict, dict, Any]]:
    """(method, path, query, headers, body): each input the hardening review found a 5xx with."""
    agent = {"Authorization": f"Bearer {key}", "X-Session": "fuzz"}
    op = {"Authorization": f"Bearer {operator_key}", "X-Tenant": TENANT, "X-Agent": AGENT}
    search = "/v1/memory/search"
    return [
        ("GET", "/v1/memory", {"after": nan_cursor()}, agent, None),
        ("POST", search, {}, agent, {"after": nan_cursor()}),
        ("POST", search, {}, agent, {"query": "x", "mode": "lexical", "labels": {"a": "\ud800"}}),
        ("POST", search, {}, agent, {"query": "x", "mode": "lexical", "labels": {"\ud800": "a"}}),
        ("POST", search, {}, agent, {"query": "x", "mode": "lexical", "kind": "\ud800"}),
        ("POST", search, {}, agent, {"ids": ["\ud800"]}),
        ("POST", "/v1/memory", {"wait": "false"}, agent, {"summary": "s", "metadata": {"k": "\udfff"}}),
        ("POST", "/v1/memory", {"wait": "false"}, agent, {"summary": "s", "labels": {"a": "\ud800"}}),
        ("POST", "/v1/admin/keys", {}, op, {"tenant": "\ud800", "agent": "a"}),
        ("POST", "/v1/admin/keys", {}, op, {"tenant": "t", "agent": "\ud800"}),
        ("GET", "/v1/memory", {}, {"Authorization": "Bearer \u00e9\u00ff"}, None),
        ("GET", "/v1/config", {}, {"Authorization": "Bearer \u00e9"}, None),
        ("POST", "/v1/memory", {"wait": "true"}, agent, {"summary": "deep", "metadata": _nested(500)}),
        ("POST", "/v1/memory", {"wait": "true"}, agent, {"summary": "deep", "metadata": _nested(230)}),
        ("PATCH", "/v1/memory/x", {}, op, {"metadata": _nested(500)}),
        ("POST", "/v1/history/search", {}, agent, {"query": "\ud800"}),
    ]


def _send(http: httpx.Client, counts: FuzzCounts, method: str, path: str, query: dict, headers: dict, body: Any,
          what: str) -> None:
    # ensure_ascii: a lone surrogate goes out as its JSON escape, as any client's encoder writes it.
    content = None if body is None else json.dumps(body).encode()
    hdrs = {**headers, **({"content-type": "application/json"} if content is not None else {})}
    # Header values go out as latin-1 bytes, as a raw client could send them.
    raw = [(k.encode(), v.encode("latin-1")) for k, v in hdrs.items()]
    qs = "&".join(f"{quote(str(k))}={v if v == RAW_INVALID_UTF8 else quote(str(v))}" for k, v in query.items())
    try:
        status = http.request(method, path + (f"?{qs}" if qs else ""), content=content, headers=raw).status_code
    except httpx.TransportError:
        status = 0
    counts.count(method, path, status, what)


def run_fuzz(api_url: str, operator_key: str, examples: int = 40, hostile_examples: int = 40) -> FuzzCounts:
    key = _prepare(api_url, operator_key)
    counts = FuzzCounts()
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    with httpx.Client(base_url=api_url, timeout=60) as http:
        for method, path, query, headers, body in known_cases(key, operator_key):
            _send(http, counts, method, path, query, headers, body, f"known case {json.dumps(body)[:80]}")
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=examples, deadline=None, database=None)
            def plain(case):
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}", "X-Session": "fuzz"}
                try:
                    status = case.call(base_url=api_url).status_code
                except requests.ConnectionError:
                    status = 0
                counts.count(case.method, case.formatted_path, status, "schemathesis case")

            @given(case=operation.as_strategy(), data=st.data())
            @settings(max_examples=hostile_examples, deadline=None, database=None)
            def hostile(case, data):
                req, what = _hostile_request(case, data, key, operator_key)
                _send(http, counts, case.method, case.formatted_path, req["params"], req["headers"], req["body"], what)

            plain()
            hostile()
    return counts


if __name__ == "__main__":  # python -m tests.e2e.fuzz_support <api url> <operator key>
    import sys

    t0 = time.monotonic()
    c = run_fuzz(sys.argv[1], sys.argv[2])
    print(json.dumps({**c.as_figures(), "seconds": round(time.monotonic() - t0, 1), "examples": c.examples}))
