"""The web sessions topic's fold: the last message of a session wins, a message older than the
one applied changes nothing, and an ended session is gone."""

from events.web_sessions import SessionBook, SessionRecord


def test_a_sign_in_read_after_its_own_sign_out_does_not_bring_the_session_back():
    book = SessionBook()
    rec = SessionRecord("digest", "csrf", expires=2_000.0)
    book.apply("s", None, offset=5)  # the process's own sign-out, learned as it was sent
    book.apply("s", rec.encode(), offset=4)  # its follower then reads the sign-in before it
    assert book.get("s", now=1_000.0) is None
    book.apply("s2", rec.encode(), offset=6)
    assert book.get("s2", now=1_000.0) == rec


def test_an_ended_session_is_gone():
    book = SessionBook()
    book.apply("s", SessionRecord("digest", "csrf", expires=2_000.0).encode(), offset=0)
    assert book.get("s", now=1_999.0) is not None
    assert book.get("s", now=2_000.0) is None and len(book) == 0
