"""Membership windows: after leaving a group conversation an agent keeps what was
said while it was a member, nothing after; a session with no membership change is always its."""

from __future__ import annotations

from dataclasses import replace

import pytest

from events.rules.history import (
    HistoryFilter,
    KeptEvent,
    decode_change,
    encode_change,
    membership_windows,
    within,
)


def test_no_change_means_always_a_member():
    assert membership_windows([]) is None
    assert within(None, 0) and within(None, 10**13)


def test_a_leave_keeps_what_came_before_and_hides_what_came_after():
    w = membership_windows([(100, True), (200, False)])
    assert w == ((100, 200),)
    assert not within(w, 99)
    assert within(w, 100) and within(w, 199)
    assert not within(w, 200) and not within(w, 300)


def test_a_first_change_that_is_a_leave_was_a_member_from_the_start():
    w = membership_windows([(200, False)])
    assert w == ((None, 200),)
    assert within(w, 0) and not within(w, 200)


def test_a_join_with_no_leave_is_still_a_member():
    w = membership_windows([(100, True)])
    assert w == ((100, None),)
    assert not within(w, 50) and within(w, 10**13)


def test_leave_and_rejoin_hides_only_the_gap_in_any_order_given():
    changes = [(300, True), (100, True), (200, False), (400, False)]
    w = membership_windows(changes)
    assert w == ((100, 200), (300, 400))
    assert [t for t in (150, 250, 350, 450) if within(w, t)] == [150, 350]
    assert membership_windows(list(reversed(changes))) == w


def test_repeated_changes_change_nothing_and_a_same_instant_rejoin_keeps_membership():
    assert membership_windows([(100, True), (150, True), (200, False), (250, False)]) == ((100, 200),)
    # A leave and a rejoin in the same millisecond: still a member across it.
    w = membership_windows([(100, True), (200, True), (200, False)])
    assert within(w, 200) and within(w, 10**9)


@pytest.mark.parametrize("at,joined,order", [(0, True, 0), (1_790_000_000_000, False, 12_345), (5, True, None)])
def test_a_change_round_trips_through_its_stored_form(at, joined, order):
    assert decode_change(encode_change(at, joined, order)) == (at, joined, order)


def test_a_value_stored_before_the_order_was_kept_still_reads():
    assert decode_change("100:1") == (100, True, None)
    assert membership_windows([decode_change("100:1"), decode_change("200:0")]) == ((100, 200),)


def test_a_join_then_a_leave_in_the_same_millisecond_is_no_membership():
    """Log order (the turns-topic offset) decides at one instant, in whatever order the hash
    gives the changes back: join then leave hides everything, not the opposite."""
    changes = [(100, True, 7), (100, False, 8)]
    for given in (changes, list(reversed(changes))):
        w = membership_windows(given)
        assert w == ()
        assert not any(within(w, t) for t in (0, 99, 100, 101, 10**13))
    # After a rejoin it is a member again from then on.
    w = membership_windows([(100, True, 7), (100, False, 8), (300, True, 9)])
    assert w == ((300, None),) and not within(w, 100) and within(w, 300)


def test_a_leave_then_a_join_in_the_same_millisecond_keeps_membership():
    changes = [(50, True, 1), (100, False, 2), (100, True, 3), (200, False, 4)]
    for given in (changes, list(reversed(changes))):
        w = membership_windows(given)
        assert all(within(w, t) for t in (50, 99, 100, 150, 199))
        assert not within(w, 49) and not within(w, 200)


def test_stored_orders_of_one_instant_sort_by_offset_not_by_text():
    # Offsets compare as numbers: 9 comes before 10.
    assert membership_windows([decode_change("100:0:10"), decode_change("100:1:9")]) == ()


def _event(session: str, agent: str = "a") -> KeptEvent:
    return KeptEvent(id="m1", tenant="t", agent=agent, session=session, turn=1, attempt=1, execution_id="x",
                     sequence=0, role="user", kind="message", text="hi", preview=False, occurred_ms=1)


def test_a_filter_without_a_session_admits_every_session_of_its_agent_only():
    f = HistoryFilter(tenant="t", agent="a", session=None, preview=False, kinds=("message",))
    assert f.admits(_event("s1")) and f.admits(_event("s2"))
    assert not f.admits(_event("s1", agent="b"))
    one = HistoryFilter(tenant="t", agent="a", session="s1", preview=False, kinds=("message",))
    assert one.admits(_event("s1")) and not one.admits(_event("s2"))


def test_across_sessions_the_callers_own_session_is_bounded_by_its_turn():
    f = HistoryFilter(tenant="t", agent="a", session=None, preview=False, kinds=("message",), own_turn=("s1", 2))
    at = {n: KeptEvent(**{**_event("s1").__dict__, "turn": n}) for n in (1, 2, 3)}
    assert f.admits(at[1]) and not f.admits(at[2]) and not f.admits(at[3])
    assert f.bounds_own(at[1]) and not f.bounds_own(at[3])
    other = KeptEvent(**{**_event("s2").__dict__, "turn": 9})
    assert f.admits(other) and f.bounds_own(other)


def test_an_agents_or_tenants_erasure_reaches_its_membership_changes_from_before_it():
    from events.rules.history import erasure_marker, membership_erased

    for marker in (erasure_marker("t", "a", None), erasure_marker("t", None, None)):
        m = {marker: 500}
        assert membership_erased(m, "t", "a", 500) and membership_erased(m, "t", "a", 1)
        assert not membership_erased(m, "t", "a", 501)  # after it: an agent given the name again
        assert not membership_erased(m, "u", "a", 1)
    assert not membership_erased({erasure_marker("t", "b", None): 500}, "t", "a", 1)
    assert not membership_erased({erasure_marker("t", "a", "fay"): 500}, "t", "a", 1)  # a member's: not the agent's


def test_a_stored_event_opens_without_its_text_and_with_no_key_for_a_check_alone(keyring):
    from events.codec import ContractError
    from projections.redis.history_view import open_event, seal_event

    e = KeptEvent(id="m1", tenant="t", agent="a", session="s1", turn=3, attempt=1, execution_id="x", sequence=0,
                  role="user", kind="message", text="The walrus plan starts in March", preview=False,
                  occurred_ms=1234, user="u1", calls=("c1",))
    raw = seal_event(e, keyring)
    assert "walrus" not in raw and open_event(raw, keyring) == e
    # A check of who said it and when needs no key.
    assert open_event(raw, None, text=False) == replace(e, text="")
    with pytest.raises(ContractError):
        open_event(raw, None)
