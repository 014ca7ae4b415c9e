"""The body guard costs little on large bodies: it parses a body again only when a lone
surrogate escape is really there, and stops reading a body once it passes the limit."""

from __future__ import annotations

import json

import pytest

from services.http import input_guard
from services.http.input_guard import MAX_BODY_BYTES, GuardBodies, body_refusal


@pytest.mark.parametrize(("body", "lone"), [
    (b'{"q": "\\ud83d\\ude00"}', False),
    (b'{"q": "\\uD83D\\uDE00 and \\ud800\\udc00"}', False),
    (b'{"q": "\\ud800"}', True),
    (b'{"q": "\\udc00"}', True),
    (b'{"q": "\\ud800\\ud800\\udc00"}', True),
    (b'{"q": "\\ud83d\\ude00\\ude00"}', True),
    (b'{"q": "\\ud800x\\udc00"}', True),
])
def test_only_a_lone_surrogate_escape_counts(body, lone):
    assert input_guard._lone_surrogate(body) is lone
    assert (body_refusal(body) is not None) is lone


def test_an_escaped_backslash_before_a_pair_cannot_hide_a_lone_half():
    # `\\ud800` is a backslash and the text "ud800"; the `\udc00` after it is alone.
    body = b'{"query": "\\\\ud800\\udc00"}'
    assert json.loads(body)["query"] == "\\ud800\udc00"
    assert body_refusal(body)[:2] == (422, "query")
    assert body_refusal(b'{"query": "\\\\ud800 plain"}') is None  # parsed again, and nothing is wrong


def test_a_body_with_only_paired_escapes_is_not_parsed_again(monkeypatch):
    def parse(*_):
        raise AssertionError("parsed again")

    monkeypatch.setattr(input_guard.json, "loads", parse)
    items = {f"k{i}": ["\U0001F600", {"x": "yy"}] for i in range(1000)}  # dumped as an escaped pair
    assert body_refusal(json.dumps(items).encode()) is None


def test_the_bad_field_is_named_among_many():
    items = {f"k{i}": ["abc", {"x": "yy"}] for i in range(1000)}
    body = json.dumps({"metadata": items}).encode()
    body = body[:-2] + b', "k5": {"deep": ["ok", "\\udfff"]}}}'
    assert body_refusal(body)[:2] == (422, "metadata.k5.deep.1")


async def test_a_body_over_the_limit_is_answered_at_once_with_limit_exceeded():
    reads, sent = 0, []
    chunk = b"x" * 65536

    async def receive():
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": chunk, "more_body": reads < 1000}

    async def send(msg):
        sent.append(msg)

    async def app(scope, receive, send):
        raise AssertionError("routed")

    await GuardBodies(app)({"type": "http", "method": "POST", "headers": []}, receive, send)
    assert reads == MAX_BODY_BYTES // len(chunk) + 1
    assert sent[0]["status"] == 413
    error = json.loads(sent[1]["body"])["error"]
    assert (error["code"], error["field"]) == ("LIMIT_EXCEEDED", "body")
