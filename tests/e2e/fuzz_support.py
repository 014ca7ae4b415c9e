"""The API fuzz, shared by the e2e test and the bench: schemathesis on every operation of
the served OpenAPI document (its health checks on), then hypothesis strategies that put
hostile values into every operation: lone surrogates (escaped, and as raw bytes), NaN and infinities, deep nesting,
huge strings, NaN cursors and odd headers.

Deterministic: every `@given` runs with the seed `FUZZ_SEED`, so two runs send the same
requests (but for the agent key, issued afresh each run, which the record shows as a
placeholder). A 5xx fails the hypothesis test it came from, so hypothesis saves that input in
the example database under `.run/fuzz-examples` and replays it first on the next run; the
fuzz goes on with the next operation. Not shrunk: each shrink step would be another request to
the stack.

Counted apart: `server_errors` (a 5xx but 503 and 504: a bug), `unavailable` (503, 504:
the service said it cannot answer now), `timeouts` (no answer in time) and `dropped` (the
connection failed without an answer). Each server error is recorded with the request that got
it: method, path with its query string, headers and body."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx
import requests
import schemathesis
from hypothesis import Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from schemathesis.core import SCHEMATHESIS_TEST_CASE_HEADER

from events import AgentConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / ".run" / "fuzz-examples"
FUZZ_SEED = 20_250_601
TIMEOUT_S = 60
BODY_LIMIT = 2_000  # characters of a body a record keeps
MAX_EXAMPLES_KEPT = 50  # distinct requests recorded per kind
# Not shrunk (each step is a request to the stack); the failing input is still saved.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
# The errors of a request that went out and got no answer: it timed out, the connection failed,
# or the server closed it without a response. Not a client's own refusal to send (httpx's
# LocalProtocolError, requests' InvalidHeader): that propagates, as the fuzz's own bug.
NO_ANSWER_HTTPX = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
NO_ANSWER_REQUESTS = (requests.Timeout, requests.ConnectionError, requests.exceptions.ChunkedEncodingError)
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


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class SentRequest:
    """A request as it went out: `path` with its query string as sent; `body` the text of the
    bytes sent, cut at `BODY_LIMIT` characters (`body_chars` the whole length, `body_sha256`
    the whole body's digest); `what` says what the fuzz put in it."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: str | None
    body_chars: int = 0
    body_sha256: str = ""
    what: str = ""

    @classmethod
    def of(cls, method: str, path: str, headers: Mapping[str, Any] | Iterable[tuple[Any, Any]],
           body: bytes | str | None, what: str = "") -> SentRequest:
        items = headers.items() if isinstance(headers, Mapping) else headers
        if isinstance(body, bytes):
            body = body.decode("utf-8", errors="backslashreplace")
        sha = hashlib.sha256(body.encode("utf-8", errors="surrogatepass")).hexdigest() if body is not None else ""
        return cls(str(method).upper(), path, tuple((_text(k), _text(v)) for k, v in items),
                   None if body is None else body[:BODY_LIMIT], 0 if body is None else len(body), sha, what)

    @property
    def truncated(self) -> bool:
        return self.body is not None and self.body_chars > len(self.body)

    def redacted(self, secrets: Mapping[str, str]) -> SentRequest:
        """The run's own keys as placeholders: issued afresh each run, they say nothing about
        the input, and a report goes to logs."""
        if not secrets:
            return self
        headers = []
        for k, v in self.headers:
            for secret, placeholder in secrets.items():
                v = v.replace(secret, placeholder)
            headers.append((k, v))
        return SentRequest(self.method, self.path, tuple(headers), self.body, self.body_chars, self.body_sha256,
                           self.what)

    def render(self) -> str:
        lines = [f"{self.method} {self.path}" + (f"   ({self.what})" if self.what else "")]
        lines += [f"    {k}: {v!r}" if not v.isprintable() else f"    {k}: {v}" for k, v in self.headers]
        if self.body is None:
            lines.append("    (no body)")
        else:
            cut = (f" [truncated: the first {len(self.body):,} of {self.body_chars:,} characters, "
                   f"sha256 {self.body_sha256}]") if self.truncated else ""
            lines.append(f"    body{cut}: {self.body}")
        return "\n".join(lines)


def kind_of(status: int) -> str:
    """The kind of an answer: "server_error" (a 5xx but 503 and 504), "unavailable" (503, 504) or "answered"."""
    if status in (503, 504):
        return "unavailable"
    return "server_error" if status >= 500 else "answered"


class ServerErrorFound(AssertionError):
    """Raised inside a hypothesis test on a server error, so hypothesis saves its input."""


@dataclass
class FuzzCounts:
    requests: int = 0
    server_errors: int = 0  # a 5xx but 503 and 504
    unavailable: int = 0  # 503, 504
    timeouts: int = 0  # no answer in time
    dropped: int = 0  # the connection failed without an answer
    # (status, request) of each distinct request that got a server error, to reproduce them.
    examples: list[tuple[int, SentRequest]] = field(default_factory=list)
    # (what happened, request): the first distinct requests answered 503/504, timed out or dropped.
    others: list[tuple[str, SentRequest]] = field(default_factory=list)
    unrecorded: int = 0  # server errors on distinct requests past MAX_EXAMPLES_KEPT
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # secret -> placeholder in records
    database: Path | None = None  # the example database, for the report
    _digest: Any = field(default_factory=hashlib.sha256, repr=False)

    def _sent(self, request: SentRequest) -> SentRequest:
        self.requests += 1
        request = request.redacted(self.secrets)
        self._digest.update(repr((request.method, request.path, request.headers, request.body_chars,
                                  request.body_sha256)).encode("utf-8", errors="backslashreplace"))
        return request

    def count(self, request: SentRequest, status: int) -> str:
        """A request answered with `status`; returns its kind (`kind_of`)."""
        request = self._sent(request)
        kind = kind_of(status)
        if kind == "server_error":
            self.server_errors += 1
            if all(r != request for _, r in self.examples):
                if len(self.examples) < MAX_EXAMPLES_KEPT:
                    self.examples.append((status, request))
                else:
                    self.unrecorded += 1
        elif kind == "unavailable":
            self.unavailable += 1
            self._note(f"answered {status}", request)
        return kind

    def count_failure(self, request: SentRequest, error: Exception) -> str:
        """A request that got no answer: "timeout" (httpx.TimeoutException, requests.Timeout)
        or "dropped" (any other transport error)."""
        request = self._sent(request)
        if isinstance(error, httpx.TimeoutException | requests.Timeout):
            self.timeouts += 1
            kind = "timeout"
        else:
            self.dropped += 1
            kind = "dropped"
        self._note(f"{kind}: {type(error).__name__}: {str(error)[:200]}", request)
        return kind

    def _note(self, what: str, request: SentRequest) -> None:
        if len(self.others) < MAX_EXAMPLES_KEPT and all(r != request for _, r in self.others):
            self.others.append((what, request))

    @property
    def digest(self) -> str:
        """sha256 of every request sent, in order: equal for two runs that sent the same requests."""
        return self._digest.hexdigest()

    def as_figures(self) -> dict[str, int]:
        return {"fuzz_requests": self.requests, "fuzz_server_errors": self.server_errors,
                "fuzz_unavailable": self.unavailable, "fuzz_timeouts": self.timeouts, "fuzz_dropped": self.dropped}

    def failure_report(self) -> str:
        lines = [f"{self.server_errors} server errors (a 5xx but 503/504) in {self.requests} requests; "
                 f"{self.as_figures()}",
                 f"hypothesis example database: {self.database or '(none)'} (a saved failing input is "
                 f"replayed first on the next run)",
                 f"{len(self.examples)} distinct requests got a server error"
                 + (f" ({self.unrecorded} more not recorded)" if self.unrecorded else "") + ":"]
        for status, request in self.examples:
            lines += [f"--- {status}", request.render()]
        if self.others:
            lines.append(f"not server errors, counted apart ({len(self.others)} recorded):")
            for what, request in self.others:
                lines += [f"--- {what}", request.render()]
        return "\n".join(lines)


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
    # The same surrogates as raw bytes (ED A0 80), not escapes: a body a raw client can send.
    st.sampled_from(SURROGATES).map(lambda s: ("raw text", s)),
    st.sampled_from(SURROGATES).map(lambda s: ("raw key", s)),
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
        if kind.endswith("key"):
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
        if kind.startswith("raw"):
            body = raw_bytes(body)
    return {"headers": headers, "params": query, "body": body}, what


def raw_bytes(body: Any) -> bytes:
    """`body` as JSON whose lone surrogates are raw bytes (ED A0 80), not escapes."""
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


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
        # The same as raw bytes: the shapes that answered 500 before the guard read them.
        ("POST", search, {}, agent, raw_bytes({"query": "q", "kind": "k\ud800"})),
        ("POST", search, {}, agent, raw_bytes({"query": "q", "labels": {"a": "\ud800"}})),
        ("POST", search, {}, agent, raw_bytes({"query": "q", "labels": {"\ud800": "a"}})),
        ("POST", search, {}, agent, raw_bytes({"query": "q", "ids": ["\ud800"]})),
        ("POST", "/v1/memory/search/batch", {}, agent, raw_bytes({"searches": [{"query": "q", "kind": "\ud800"}]})),
        ("POST", "/v1/memory", {"wait": "false"}, agent, b'{"summary": "caf\xe9"}'),
    ]


def _send(http: httpx.Client, counts: FuzzCounts, method: str, path: str, query: dict, headers: dict, body: Any,
          what: str) -> str:
    """Sends one request and counts it; returns its kind (`FuzzCounts.count`)."""
    # ensure_ascii: a lone surrogate goes out as its JSON escape, as any client's encoder writes it.
    content = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {**headers, **({"content-type": "application/json"} if content is not None else {})}
    # Header values go out as latin-1 bytes, as a raw client could send them.
    raw = [(k.encode(), v.encode("latin-1")) for k, v in hdrs.items()]
    qs = "&".join(f"{quote(str(k))}={v if v == RAW_INVALID_UTF8 else quote(str(v))}" for k, v in query.items())
    target = path + (f"?{qs}" if qs else "")
    sent = SentRequest.of(method, target, hdrs, content, what)
    try:
        status = http.request(method, target, content=content, headers=raw).status_code
    except NO_ANSWER_HTTPX as e:
        return counts.count_failure(sent, e)
    return counts.count(sent, status)


def _schemathesis_request(case: Any, api_url: str, sent: requests.PreparedRequest | None) -> SentRequest:
    """What schemathesis sent for `case`: the prepared request when there is one (a response's,
    or a transport error's), else the case serialized as the transport would send it."""
    what = "schemathesis case"
    if isinstance(sent, requests.PreparedRequest):
        return SentRequest.of(sent.method or case.method, sent.path_url, sent.headers, sent.body, what)
    kw = case.as_transport_kwargs(base_url=api_url)
    url = urlsplit(kw["url"])
    params = urlencode(kw.get("params") or {}, doseq=True)
    path = url.path + (f"?{url.query}" if url.query else "") + (("&" if url.query else "?") + params if params else "")
    body = kw.get("data")
    if body is None and "json" in kw:
        body = json.dumps(kw["json"])
    return SentRequest.of(kw["method"], path, kw.get("headers") or {}, body if isinstance(body, str | bytes) else
                          None if body is None else repr(body), what)


def _seeded(test: Any, label: str, max_examples: int, database: DirectoryBasedExampleDatabase) -> Any:
    """`test` (a `@given` test) with the fixed seed and the example database. `@seed` sets the
    database to None in the settings it finds, so the settings go on after it; checked here, as
    it rests on the order hypothesis applies them in."""
    test = settings(max_examples=max_examples, deadline=None, database=database, phases=PHASES,
                    report_multiple_bugs=False)(seed(FUZZ_SEED)(test))
    # Each operation's own key in the database (the tests' source is the same for every one),
    # as schemathesis' own runner does.
    test.hypothesis.inner_test._hypothesis_internal_add_digest = label.encode()
    assert test._hypothesis_internal_use_seed == FUZZ_SEED, "hypothesis dropped the fuzz's seed"
    assert test._hypothesis_internal_use_settings.database is database, "hypothesis dropped the example database"
    return test


def _run(test: Any) -> None:
    """Runs a hypothesis test; a server error it raised (and hypothesis saved) is already counted."""
    try:
        test()
    except* ServerErrorFound:
        pass  # in `counts`, with its request; the fuzz goes on with the next test


def run_fuzz(api_url: str, operator_key: str, examples: int = 40, hostile_examples: int = 40) -> FuzzCounts:
    key = _prepare(api_url, operator_key)
    EXAMPLES_DIR.mkdir(parents=True, exist_ok=True)
    database = DirectoryBasedExampleDatabase(EXAMPLES_DIR)
    counts = FuzzCounts(secrets={key: "<agent key fuzz/fuzzer>", operator_key: "<operator key>"}, database=EXAMPLES_DIR)
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    with httpx.Client(base_url=api_url, timeout=TIMEOUT_S) as http:
        for method, path, query, headers, body in known_cases(key, operator_key):
            shown = body.decode("utf-8", "backslashreplace") if isinstance(body, bytes) else json.dumps(body)
            _send(http, counts, method, path, query, headers, body, f"known case {shown[:80]}")
        for operation in operations:

            @given(case=operation.as_strategy())
            def plain(case):
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}", "X-Session": "fuzz"}
                # schemathesis' test case id is random per run; a fixed one keeps the requests the same.
                extra = {SCHEMATHESIS_TEST_CASE_HEADER: "fuzz"}
                try:
                    response = case.call(base_url=api_url, headers=extra, timeout=TIMEOUT_S)
                except NO_ANSWER_REQUESTS as e:
                    counts.count_failure(_schemathesis_request(case, api_url, e.request), e)
                    return
                sent = _schemathesis_request(case, api_url, response.request)
                if counts.count(sent, response.status_code) == "server_error":
                    raise ServerErrorFound(f"{response.status_code} for {sent.method} {sent.path}")

            @given(case=operation.as_strategy(), data=st.data())
            def hostile(case, data):
                req, what = _hostile_request(case, data, key, operator_key)
                if _send(http, counts, case.method, case.formatted_path, req["params"], req["headers"], req["body"],
                         what) == "server_error":
                    raise ServerErrorFound(f"a server error for {case.method} {case.formatted_path} ({what})")

            _run(_seeded(plain, f"plain {operation.label}", examples, database))
            _run(_seeded(hostile, f"hostile {operation.label}", hostile_examples, database))
    return counts


if __name__ == "__main__":  # python -m tests.e2e.fuzz_support <api url> <operator key>
    import sys

    t0 = time.monotonic()
    c = run_fuzz(sys.argv[1], sys.argv[2])
    print(json.dumps({**c.as_figures(), "seconds": round(time.monotonic() - t0, 1), "digest": c.digest}))
    if c.server_errors:
        print(c.failure_report())
