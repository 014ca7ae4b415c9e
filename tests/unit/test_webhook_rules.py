"""The webhook rules: what an event tells, a delivery's id and signature, the URLs refused."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from events.codec import PLAIN
from events.lean import decode_lean
from events.memory import RecordDeleted, SubjectErased
from events.record import MemoryRecord, Scope, Status
from events.rules import webhooks as rules

AT = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_record_event_tells_ids_and_kinds_never_text():
    r = MemoryRecord(id="r1", version=2, created=AT, modified=AT, tenant="t", agent="a", scope=Scope.USER, user="u",
                     kind="fact", summary="Dana's locker code is 4411", status=Status.DELETED)
    e = RecordDeleted(event_id="e1", command_id="c1", tenant="t", agent="a", occurred_at=AT, record=r)
    for event in (e, decode_lean(PLAIN.encode(e))):  # the full event and the lean one the worker reads
        [n] = rules.notices(event)
        assert (n.kind, n.data) == ("memory.changed", {"action": "deleted", "record_id": "r1", "version": 2,
                                                        "kind": "fact", "scope": "USER", "user": "u"})
        assert "4411" not in rules.body_of("d1", n, AT.isoformat())


def test_an_erasure_tells_whose():
    e = SubjectErased(event_id="e2", command_id="c2", tenant="t", agent="a", occurred_at=AT, user="u")
    [n] = rules.notices(e)
    assert (n.kind, n.data) == ("subject.erased", {"agent": "a", "user": "u"})


def test_a_delivery_id_names_the_event_and_the_webhook():
    one = rules.delivery_id("w1", 3, 41, "memory.changed")
    assert one == rules.delivery_id("w1", 3, 41, "memory.changed")
    assert len({one, rules.delivery_id("w2", 3, 41, "memory.changed"), rules.delivery_id("w1", 3, 42, "memory.changed"),
                rules.delivery_id("w1", 4, 41, "memory.changed")}) == 4


def test_the_signature_is_hmac_sha256_of_timestamp_and_body():
    want = hmac.new(b"s3cret", b"1700000000.{\"a\":1}", hashlib.sha256).hexdigest()
    assert rules.signature("s3cret", 1700000000, '{"a":1}') == f"v1={want}"


def test_an_endpoint_must_be_http_and_outside_development_not_loopback_or_link_local():
    resolve = {"hooks.example.com": ["93.184.216.34"], "localhost": ["127.0.0.1"], "meta": ["169.254.169.254"],
               "v6": ["::1"]}.__getitem__
    assert rules.url_refusal("https://hooks.example.com/x", False, resolve) is None
    assert rules.url_refusal("ftp://hooks.example.com/x", False, resolve).startswith("url: an http or https URL")
    for host in ("localhost", "meta", "v6"):
        assert "loopback or link-local" in rules.url_refusal(f"http://{host}/x", False, resolve)
        assert rules.url_refusal(f"http://{host}/x", True, resolve) is None  # development: local receivers
    assert "does not resolve" in rules.url_refusal("http://nowhere/x", False, lambda h: (_ for _ in ()).throw(OSError()))


def test_a_reviewed_turn_tells_its_decisions_and_a_skipped_one_why():
    from events.usage import Decision, MemorySkipped, TurnReviewed

    base = dict(tenant="t", agent="a", occurred_at=AT, session="s1", turn=3)
    done = TurnReviewed(usage_id="u1", **base, decided=[Decision(decision="replace", record_id="r2", replaces="r1",
                                                                 kind="fact")], skipped=2, refused=1)
    [n] = rules.notices(done)
    assert (n.kind, n.data) == ("turn.processed", {
        "session": "s1", "turn": 3, "reviewed": True, "skipped": 2, "refused": 1,
        "decided": [{"decision": "replace", "record_id": "r2", "replaces": "r1", "kind": "fact"}]})
    skipped = MemorySkipped(usage_id="u2", **base, user="u", reason="consent_required")
    [n] = rules.notices(skipped)
    assert n.data == {"session": "s1", "turn": 3, "user": "u", "reviewed": False, "reason": "consent_required"}
    # A session's skip at its end is no turn's.
    assert rules.notices(skipped.model_copy(update={"turn": None})) == []


def test_text_is_told_only_of_a_record_written_and_not_a_members():
    def record(user, status=Status.ACTIVE):
        return MemoryRecord(id="r1", version=1, created=AT, modified=AT, tenant="t", agent="a", scope=Scope.AGENT, user=user,
                            kind="fact", summary="Doors open at 9", status=status)

    added = rules.Notice("memory.changed", "t", "a", {"action": "added", "record_id": "r1"})
    deleted = rules.Notice("memory.changed", "t", "a", {"action": "deleted", "record_id": "r1"})
    assert rules.text_to_tell(added, record(None))
    assert not rules.text_to_tell(added, record("u"))
    assert not rules.text_to_tell(deleted, record(None, Status.DELETED))
    assert rules.with_text(added, record(None)).data["summary"] == "Doors open at 9"
