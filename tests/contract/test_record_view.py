"""One suite, run against every adapter of the record view (pure fold and Redis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events import BlockChanged, RecordAdded, RecordDeleted, RecordPinned, RecordSuperseded
from events.record import MemoryRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rec(rid: str, version: int = 1, minute: int = 0, **kw) -> MemoryRecord:
    base = dict(
        id=rid,
        version=version,
        created=T0 + timedelta(minutes=minute),
        modified=T0 + timedelta(minutes=minute, seconds=version),
        tenant="t",
        agent="a",
        scope="AGENT",
        kind="fact",
        summary=f"{rid} v{version}",
    )
    base.update(kw)
    return MemoryRecord(**base)


def ev(cls, r: MemoryRecord):
    return cls(event_id=f"{r.id}-{r.version}", command_id=f"c-{r.id}-{r.version}", tenant=r.tenant,
               agent=r.agent, occurred_at=r.modified, record=r)


async def test_get_reads_current_and_exact_versions(view):
    await view.apply([ev(RecordAdded, rec("r1")), ev(RecordSuperseded, rec("r1", 2, status="SUPERSEDED"))])
    assert (await view.get("t", "a", "r1")).version == 2
    assert (await view.get("t", "a", "r1", 1)).summary == "r1 v1"
    assert await view.get("t", "a", "r1", 3) is None
    assert await view.get("t", "a", "nope") is None
    assert await view.get("t", "other", "r1") is None


async def test_history_is_newest_first(view):
    await view.apply([ev(RecordAdded, rec("r1")), ev(RecordPinned, rec("r1", 2, pinned=True)),
                      ev(RecordDeleted, rec("r1", 3, status="DELETED"))])
    assert [r.version for r in await view.history("t", "a", "r1")] == [3, 2, 1]


async def test_older_version_after_newer_changes_nothing(view):
    await view.apply([ev(RecordDeleted, rec("r1", 2, status="DELETED"))])
    await view.apply([ev(RecordAdded, rec("r1", 1))])
    assert (await view.get("t", "a", "r1")).status.value == "DELETED"
    assert (await view.page("t", "a", 10)).records == []


async def test_duplicates_are_idempotent(view):
    e = ev(RecordAdded, rec("r1"))
    await view.apply([e, e])
    await view.apply([e])
    page = await view.page("t", "a", 10)
    assert [r.id for r in page.records] == ["r1"]
    assert len(await view.history("t", "a", "r1")) == 1


async def test_listing_pages_newest_first_then_ascending(view):
    await view.apply([ev(RecordAdded, rec(f"r{i}", minute=i)) for i in range(7)])
    await view.apply([ev(RecordDeleted, rec("r3", 2, minute=3, status="DELETED"))])
    seen, cursor = [], None
    while True:
        page = await view.page("t", "a", 2, cursor)
        seen += [r.id for r in page.records]
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == ["r6", "r5", "r4", "r2", "r1", "r0"]
    asc = await view.page("t", "a", 4, ascending=True)
    assert [r.id for r in asc.records] == ["r0", "r1", "r2", "r4"]
    rest = await view.page("t", "a", 4, asc.next_cursor, ascending=True)
    assert [r.id for r in rest.records] == ["r5", "r6"] and rest.next_cursor is None


async def test_ties_in_creation_time_page_without_gaps(view):
    await view.apply([ev(RecordAdded, rec(f"r{i}", minute=0)) for i in range(5)])
    first = await view.page("t", "a", 3)
    second = await view.page("t", "a", 3, first.next_cursor)
    ids = [r.id for r in first.records + second.records]
    assert sorted(ids) == [f"r{i}" for i in range(5)] and len(set(ids)) == 5


async def test_preview_deletions_stay_listed_other_deletions_do_not(view):
    await view.apply([ev(RecordDeleted, rec("p1", status="DELETED", preview=True)),
                      ev(RecordDeleted, rec("d1", status="DELETED"))])
    assert [r.id for r in (await view.page("t", "a", 10)).records] == ["p1"]


async def test_pinned_set_follows_the_current_version(view):
    await view.apply([ev(RecordAdded, rec("r1")), ev(RecordPinned, rec("r1", 2, pinned=True)),
                      ev(RecordAdded, rec("r2", minute=1))])
    assert [r.id for r in await view.pinned("t", "a")] == ["r1"]
    await view.apply([ev(RecordDeleted, rec("r1", 3, status="DELETED"))])
    assert await view.pinned("t", "a") == []


async def test_a_preview_record_shadows_the_live_record_it_replaces(view):
    await view.apply([ev(RecordAdded, rec("live")), ev(RecordAdded, rec("other", minute=1)),
                      ev(RecordAdded, rec("draft", minute=2, preview=True, replaces="live")),
                      ev(RecordDeleted, rec("gone", minute=3, status="DELETED", preview=True, replaces="other")),
                      ev(RecordAdded, rec("fix", minute=4, replaces="draft"))])  # not a preview record
    assert await view.shadowed("t", "a") == {"live", "other"}
    assert await view.shadowed("t", "b") == set()


async def test_blocks_hold_their_newest_text_and_go_when_emptied(view):
    def change(n: int, label: str, text: str, agent: str = "a"):
        return BlockChanged(event_id=f"b{n}", command_id=f"cb{n}", tenant="t", agent=agent, occurred_at=T0,
                            label=label, text=text)

    await view.apply([change(1, "stack", "Python"), change(2, "stack", "Python\nKafka"), change(3, "style", "Tabs"),
                      change(4, "stack", "Go", agent="b")])
    assert await view.blocks("t", "a") == {"stack": "Python\nKafka", "style": "Tabs"}
    await view.apply([change(5, "style", "")])
    assert await view.blocks("t", "a") == {"stack": "Python\nKafka"}
    assert await view.blocks("t", "b") == {"stack": "Go"}


def subject_ev(cls, agent: str = "a", **kw):
    return cls(event_id=f"s-{cls.__name__}-{agent}-{kw.get('user')}", command_id="c", tenant="t", agent=agent,
               occurred_at=T0, **kw)


async def test_consent_is_the_newest_grant_or_withdrawal_and_removal_is_for_good(view):
    from events import AgentRemoved, ConsentGranted, ConsentWithdrawn, UserRemoved
    from events.commands import WORKSPACE

    assert await view.subject("t", "a", "u1") == type(await view.subject("t", "a", "u1"))()
    await view.apply([subject_ev(ConsentGranted, user="u1"), subject_ev(ConsentGranted, user="u2")])
    await view.apply([subject_ev(ConsentWithdrawn, user="u2")])
    assert (await view.subject("t", "a", "u1")).consent == "granted"
    assert (await view.subject("t", "a", "u2")).consent == "withdrawn"
    assert (await view.subject("t", "b", "u1")).consent is None  # consent is per agent
    assert await view.consents("t", "a") == {"u1": "granted", "u2": "withdrawn"}
    await view.apply([subject_ev(UserRemoved, agent=WORKSPACE, user="u1"), subject_ev(AgentRemoved, agent="b")])
    assert (await view.subject("t", "a", "u1")).user_removed  # a member's removal holds for every agent
    assert not (await view.subject("t", "a", "u2")).user_removed
    assert (await view.subject("t", "b", None)).agent_removed
    assert not (await view.subject("t", "a", None)).agent_removed


def urec(rid: str, user: str, minute: int, version: int = 1, **kw) -> MemoryRecord:
    """A member's (USER) record."""
    return rec(rid, version, minute, scope="USER", user=user, **kw)


async def test_a_members_listing_holds_their_own_listed_user_records(view):
    await view.apply([ev(RecordAdded, urec(f"ann{i}", "ann", i)) for i in range(6)]
                     + [ev(RecordAdded, urec(f"bob{i}", "bob", 10 + i)) for i in range(2)]
                     + [ev(RecordAdded, rec("shared", minute=20)),
                        ev(RecordAdded, rec("ann-said", minute=21, user="ann")),  # names ann, but the agent's
                        ev(RecordAdded, rec("ann-session", minute=22, scope="SESSION", session="s1", user="ann")),
                        ev(RecordAdded, urec("ann-elsewhere", "ann", 23, agent="b")),
                        ev(RecordAdded, urec("cat0", "cat", 24)),
                        ev(RecordDeleted, urec("bob-draft", "bob", 25, status="DELETED", preview=True))])
    # A deleted and a superseded record leave the member's listing, as they leave the agent's.
    await view.apply([ev(RecordDeleted, urec("ann1", "ann", 1, 2, status="DELETED")),
                      ev(RecordSuperseded, urec("ann3", "ann", 3, 2, status="SUPERSEDED")),
                      ev(RecordDeleted, urec("cat0", "cat", 24, 2, status="DELETED"))])
    seen, cursor = [], None
    while True:
        page = await view.page("t", "a", 2, cursor, user="ann")
        assert len(page.records) <= 2
        seen += [r.id for r in page.records]
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == ["ann5", "ann4", "ann2", "ann0"]
    asc = await view.page("t", "a", 3, ascending=True, user="ann")
    assert [r.id for r in asc.records] == ["ann0", "ann2", "ann4"] and asc.next_cursor
    rest = await view.page("t", "a", 3, asc.next_cursor, ascending=True, user="ann")
    assert [r.id for r in rest.records] == ["ann5"] and rest.next_cursor is None
    # A preview deletion stays listed, as in the agent's listing.
    assert [r.id for r in (await view.page("t", "a", 10, user="bob")).records] == ["bob-draft", "bob1", "bob0"]
    assert (await view.page("t", "a", 10, user="cat")).records == []
    assert (await view.page("t", "a", 10, user="dan")).records == []
    assert [r.id for r in (await view.page("t", "b", 10, user="ann")).records] == ["ann-elsewhere"]
    # The agent's listing still holds every member's records and the other scopes'.
    everything = [r.id for r in (await view.page("t", "a", 100)).records]
    assert everything == ["bob-draft", "ann-session", "ann-said", "shared", "bob1", "bob0",
                          "ann5", "ann4", "ann2", "ann0"]
    # Members who have or had user-scope records: cat's only one is deleted; "ann-said" is not ann's.
    assert await view.users("t", "a") == {"ann", "bob", "cat"}
    assert await view.users("t", "b") == {"ann"}
    assert await view.users("t", "c") == set()


async def test_a_members_listing_follows_the_current_version(view):
    await view.apply([ev(RecordDeleted, urec("ann0", "ann", 0, 2, status="DELETED"))])
    await view.apply([ev(RecordAdded, urec("ann0", "ann", 0))])  # older: changes nothing
    assert (await view.page("t", "a", 10, user="ann")).records == []
    await view.apply([ev(RecordAdded, urec("ann1", "ann", 1)), ev(RecordAdded, urec("ann1", "ann", 1))])
    await view.apply([ev(RecordPinned, urec("ann1", "ann", 1, 2, pinned=True))])
    page = await view.page("t", "a", 10, user="ann")
    assert [(r.id, r.version) for r in page.records] == [("ann1", 2)] and page.next_cursor is None
    assert await view.users("t", "a") == {"ann"}
