"""The API fuzz's counting (tests/e2e/fuzz_support.py): a server error is a 5xx but 503 and
504, recorded with its request; 503/504, timeouts and dropped connections are counted apart;
the failure report shows each recorded request whole. No stack: pure counting, and the
seeded hypothesis tests the fuzz builds."""

from __future__ import annotations

import httpx
import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

from tests.e2e import fuzz_support as fs
from tests.e2e.fuzz_support import BODY_LIMIT, FuzzCounts, SentRequest


def req(path: str = "/v1/memory?wait=true", body: str | None = '{"summary": "s"}', **headers: str) -> SentRequest:
    return SentRequest.of("post", path, {"Authorization": "Bearer k", **headers}, body, "body summary text")


def test_a_500_is_a_server_error_with_its_request_recorded():
    c = FuzzCounts()
    assert c.count(req(), 500) == "server_error"
    assert (c.requests, c.server_errors, c.unavailable, c.timeouts, c.dropped) == (1, 1, 0, 0, 0)
    assert c.examples == [(500, req())]
    status, r = c.examples[0]
    assert (r.method, r.path, r.headers, r.body) == (
        "POST", "/v1/memory?wait=true", (("Authorization", "Bearer k"),), '{"summary": "s"}')


def test_other_5xx_but_503_and_504_are_server_errors():
    c = FuzzCounts()
    for status in (501, 502, 505, 599):
        c.count(req(path=f"/s{status}"), status)
    assert c.server_errors == 4 and c.unavailable == 0


def test_unavailable_timeouts_and_drops_are_counted_apart():
    c = FuzzCounts()
    assert c.count(req(path="/a"), 503) == "unavailable"
    assert c.count(req(path="/b"), 504) == "unavailable"
    assert c.count_failure(req(path="/c"), httpx.ReadTimeout("slow")) == "timeout"
    assert c.count_failure(req(path="/d"), requests.ReadTimeout("slow")) == "timeout"
    # requests' ConnectTimeout is a ConnectionError too: no answer in time, a timeout.
    assert c.count_failure(req(path="/e"), requests.ConnectTimeout("slow")) == "timeout"
    assert c.count_failure(req(path="/f"), httpx.RemoteProtocolError("Server disconnected")) == "dropped"
    assert c.count_failure(req(path="/g"), requests.ConnectionError("reset")) == "dropped"
    assert c.count(req(path="/h"), 200) == "answered"
    assert c.count(req(path="/i"), 422) == "answered"
    assert (c.requests, c.server_errors, c.unavailable, c.timeouts, c.dropped) == (9, 0, 2, 3, 2)
    assert c.examples == []
    assert [r.path for _, r in c.others] == ["/a", "/b", "/c", "/d", "/e", "/f", "/g"]
    assert c.as_figures() == {"fuzz_requests": 9, "fuzz_server_errors": 0, "fuzz_unavailable": 2,
                              "fuzz_timeouts": 3, "fuzz_dropped": 2}


def test_examples_dedupe():
    c = FuzzCounts()
    c.count(req(), 500)
    c.count(req(), 500)  # the same request again (hypothesis replays a failing input)
    c.count(req(), 502)
    c.count(req(body='{"summary": "t"}'), 500)
    c.count(req(**{"X-Turn": "NaN"}), 500)
    assert c.server_errors == 5 and c.requests == 5
    assert [(s, r.body, r.headers[-1][0]) for s, r in c.examples] == [
        (500, '{"summary": "s"}', "Authorization"), (500, '{"summary": "t"}', "Authorization"),
        (500, '{"summary": "s"}', "X-Turn")]


def test_examples_past_the_cap_are_counted_not_kept():
    c = FuzzCounts()
    for i in range(fs.MAX_EXAMPLES_KEPT + 3):
        c.count(req(path=f"/p{i}"), 500)
    assert len(c.examples) == fs.MAX_EXAMPLES_KEPT and c.unrecorded == 3
    assert "(3 more not recorded)" in c.failure_report()


def test_failure_report_shows_method_path_headers_and_body(tmp_path):
    c = FuzzCounts(database=tmp_path / "fuzz-examples")
    c.count(SentRequest.of("PATCH", "/v1/memory/x?after=NaN", {"Authorization": "Bearer k", "X-Turn": "1e999"},
                           b'{"metadata": {"k": "\\udfff"}}', "body metadata text"), 500)
    c.count(req(path="/slow"), 504)
    report = c.failure_report()
    assert "1 server errors" in report
    assert "--- 500\nPATCH /v1/memory/x?after=NaN   (body metadata text)" in report
    assert "    Authorization: Bearer k" in report and "    X-Turn: 1e999" in report
    assert '    body: {"metadata": {"k": "\\udfff"}}' in report
    assert str(tmp_path / "fuzz-examples") in report
    assert "--- answered 504\nPOST /slow" in report  # shown, apart from the server errors


def test_a_long_body_is_cut_and_marked():
    body = "m" * (BODY_LIMIT * 3)
    r = SentRequest.of("POST", "/v1/memory", {}, body)
    assert r.truncated and len(r.body) == BODY_LIMIT and r.body_chars == BODY_LIMIT * 3
    assert f"[truncated: the first {BODY_LIMIT:,} of {BODY_LIMIT * 3:,} characters" in r.render()
    short = SentRequest.of("POST", "/v1/memory", {}, "m" * BODY_LIMIT)
    assert not short.truncated and "truncated" not in short.render()
    assert "(no body)" in SentRequest.of("GET", "/v1/memory", {}, None).render()
    # Two bodies alike in their first BODY_LIMIT characters are still two requests.
    assert SentRequest.of("POST", "/", {}, body) != SentRequest.of("POST", "/", {}, body[:-1] + "n")


def test_the_runs_keys_are_placeholders_in_records():
    c = FuzzCounts(secrets={"ml_a_secret": "<agent key>"})
    c.count(SentRequest.of("GET", "/v1/memory", {"Authorization": "Bearer ml_a_secret"}, None), 500)
    assert c.examples[0][1].headers == (("Authorization", "Bearer <agent key>"),)
    assert "ml_a_secret" not in c.failure_report() and "ml_a_secret" not in repr(c)  # pytest prints the repr


def test_the_digest_follows_the_requests_sent():
    a, b, other = FuzzCounts(), FuzzCounts(), FuzzCounts()
    for c in (a, b):
        c.count(req(), 200)
        c.count_failure(req(path="/x"), httpx.ReadTimeout("slow"))
    other.count(req(), 200)
    other.count_failure(req(path="/y"), httpx.ReadTimeout("slow"))
    assert a.digest == b.digest != other.digest


def test_the_fuzz_tests_are_seeded_and_keep_the_database():
    db = InMemoryExampleDatabase()

    def drawn() -> list[int]:
        seen: list[int] = []

        @given(st.integers(0, 10**9))
        def t(x):
            seen.append(x)

        fs._run(fs._seeded(t, "plain GET /x", 20, db))  # asserts the seed and the database stay
        return seen

    first = drawn()
    assert first == drawn() and len(first) == 20


def test_a_server_error_fails_its_test_and_lands_in_the_database():
    db = InMemoryExampleDatabase()
    calls: list[int] = []

    def run() -> None:
        @given(st.integers(0, 1000))
        def t(x):
            calls.append(x)
            if x > 500:
                raise fs.ServerErrorFound(str(x))

        fs._run(fs._seeded(t, "hostile POST /y", 100, db))  # swallowed: already counted

    run()
    failing = calls[-1]
    assert failing > 500 and calls.count(failing) >= 2  # found, then replayed to report
    assert any(db.fetch(k) for k in list(db.data))
    calls.clear()
    run()
    assert calls[0] == failing  # the saved input goes first on the next run


def test_any_other_error_of_a_fuzz_test_propagates():
    @given(st.integers())
    def t(x):
        raise KeyError(x)

    with pytest.raises(KeyError):
        fs._run(fs._seeded(t, "plain GET /z", 5, InMemoryExampleDatabase()))
