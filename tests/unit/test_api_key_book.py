"""The fold of `memlane.apikeys` (events/api_keys.py): what a follower knows of each key after
reading the topic, compacted or not."""

from __future__ import annotations

from events.api_keys import KeyBook, KeyRecord
from events.topics import API_KEYS

ENTRY = {"id": "d1" * 8, "tenant": "acme", "agent": "bot", "role": "agent", "created": "2026-12-01T00:00:00+00:00"}


def rec(revoked: str | None = None, adopted: bool = False, digest: str = "d1" * 32, **entry) -> KeyRecord:
    return KeyRecord(digest, {**ENTRY, **entry}, revoked, adopted)


def test_a_revocation_is_the_keys_last_value_under_its_digest_never_a_tombstone():
    live, revoked = rec(), rec(revoked="2026-12-02T00:00:00+00:00")
    assert live.topic_key == revoked.topic_key == b"d1" * 32  # so compaction keeps the revocation
    assert KeyRecord.decode(revoked.topic_key, revoked.encode()) == revoked
    assert API_KEYS.compacted and API_KEYS.partitions == 1 and API_KEYS.key(revoked) == "d1" * 32
    book = KeyBook()
    book.apply(live.topic_key, live.encode(), 0)
    assert book.get(live.digest).revoked is None and book.find("acme", ENTRY["id"]) == live
    book.apply(revoked.topic_key, revoked.encode(), 1)
    assert book.get(live.digest) == revoked and book.live("acme") == [] and len(book) == 1


def test_a_revocation_wins_over_an_adoption_written_before_or_after_it():
    adopted, revoked = rec(adopted=True), rec(revoked="2026-12-02T00:00:00+00:00")
    assert adopted.topic_key != revoked.topic_key  # compaction keeps both
    for order in ((adopted, revoked), (revoked, adopted)):
        book = KeyBook()
        for offset, r in enumerate(order):
            book.apply(r.topic_key, r.encode(), offset)
        assert book.get(revoked.digest) == revoked and book.live("acme") == []
    book = KeyBook()
    book.apply(adopted.topic_key, adopted.encode(), 0)
    assert book.live("acme") == [adopted]


def test_a_record_older_than_the_one_held_changes_nothing():
    # A process learns its own revocation as it sends it (offset 7), then its follower reads the
    # issue that came before (offset 3): the book keeps the revocation.
    live, revoked = rec(), rec(revoked="2026-12-02T00:00:00+00:00")
    book = KeyBook()
    book.apply(revoked.topic_key, revoked.encode(), 7)
    assert book.apply(live.topic_key, live.encode(), 3) == revoked
    assert book.apply(revoked.topic_key, revoked.encode(), 7) == revoked


def test_the_book_holds_digests_and_public_entries_only():
    r = rec(role="member", user="dana")
    assert set(KeyRecord.decode(r.topic_key, r.encode()).entry) == {"id", "tenant", "agent", "role", "created", "user"}
