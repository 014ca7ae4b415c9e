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


async def test_consent_is_the_newest_grant_or_withdrawal_and_removal_holds_until_restored(view):
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
    # Removed until an operator restores them; a tenant's removal is its tenant-wide erasure.
    from events import TenantRestored, UserRestored

    await view.apply([subject_ev(UserRestored, agent=WORKSPACE, user="u1")])
    assert not (await view.subject("t", "a", "u1")).user_removed
    await view.apply([erased(WORKSPACE, tenant_wide=True)])
    assert (await view.subject("t", "a", "u2")).tenant_removed and (await view.subject("t", "b", None)).tenant_removed
    assert not (await view.subject("u", "a", None)).tenant_removed
    await view.apply([subject_ev(TenantRestored, agent=WORKSPACE)])
    assert not (await view.subject("t", "a", "u2")).tenant_removed


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


# ----------------------------------------------------------------- erasure and purges


def erased(agent: str = "a", user: str | None = None, tenant: str = "t", tenant_wide: bool = False):
    from events import SubjectErased

    return SubjectErased(event_id=f"x-{tenant}-{agent}-{user}-{tenant_wide}", command_id="cx", tenant=tenant,
                         agent=agent, occurred_at=T0, user=user, tenant_wide=tenant_wide)


async def two_members(view) -> None:
    """ann and bob on agents a and b of tenant t, ann in tenant u too; pins, expiry, shadows,
    blocks and consent rows."""
    from events import ConsentGranted

    await view.apply([
        ev(RecordAdded, urec("ann1", "ann", 1)), ev(RecordPinned, urec("ann1", "ann", 1, 2, pinned=True)),
        ev(RecordAdded, urec("ann2", "ann", 2, expires_at=T0 + timedelta(days=1))),
        ev(RecordAdded, urec("ann3", "ann", 3)), ev(RecordDeleted, urec("ann3", "ann", 3, 2, status="DELETED")),
        ev(RecordAdded, urec("ann-draft", "ann", 4, preview=True, replaces="shared")),
        ev(RecordAdded, urec("bob1", "bob", 5)),
        ev(RecordAdded, rec("shared", minute=6)),  # the agent's: made in no member's turn
        ev(RecordAdded, rec("ann-said", minute=10, user="ann")),  # agent scope, made from ann's turn: hers
        ev(RecordAdded, urec("ann-b", "ann", 7, agent="b")), ev(RecordAdded, urec("bob-b", "bob", 8, agent="b")),
        ev(RecordAdded, urec("ann-u", "ann", 9, tenant="u")),
        *[subject_ev(ConsentGranted, agent=agent, user=user) for agent in ("a", "b") for user in ("ann", "bob")],
        BlockChanged(event_id="blk", command_id="cb", tenant="t", agent="a", occurred_at=T0, label="style", text="Tabs"),
    ])


async def ids(view, agent="a", user=None, tenant="t"):
    return sorted(r.id for r in (await view.page(tenant, agent, 100, user=user)).records)


async def test_erasing_a_member_on_an_agent_drops_every_version_of_theirs_and_nothing_else(view):
    await two_members(view)
    for _ in range(2):  # a replay applies it again
        await view.apply([erased(user="ann")])
        for rid in ("ann1", "ann2", "ann3", "ann-draft", "ann-said"):
            assert await view.get("t", "a", rid) is None and await view.history("t", "a", rid) == []
            assert await view.get("t", "a", rid, 1) is None
        assert await ids(view) == ["bob1", "shared"]
        assert await ids(view, user="ann") == [] and await ids(view, user="bob") == ["bob1"]
        assert await view.users("t", "a") == {"bob"}
        assert await view.consents("t", "a") == {"bob": "granted"}
        assert (await view.subject("t", "a", "ann")).consent is None
        assert await view.pinned("t", "a") == []
        assert await view.shadowed("t", "a") == {"shared"}  # another record's state: the agent's
        assert await view.blocks("t", "a") == {"style": "Tabs"}  # the agent's, not the member's
        # The same member on another agent, or in another tenant, is another subject.
        assert await ids(view, "b") == ["ann-b", "bob-b"] and await view.consents("t", "b") == {"ann": "granted",
                                                                                                 "bob": "granted"}
        assert await ids(view, tenant="u") == ["ann-u"]
        if hasattr(view, "expired"):
            assert await view.expired(int((T0 + timedelta(days=2)).timestamp() * 1000)) == {}


async def test_erasing_a_member_under_the_workspace_agent_reaches_every_agent_of_the_tenant(view):
    from events.commands import WORKSPACE

    await two_members(view)
    await view.apply([erased(WORKSPACE, "ann")])
    assert await ids(view) == ["bob1", "shared"] and await ids(view, "b") == ["bob-b"]
    assert await view.get("t", "a", "ann-said") is None
    assert await view.users("t", "a") == {"bob"} == await view.users("t", "b")
    assert await view.consents("t", "b") == {"bob": "granted"}
    assert await view.get("t", "b", "ann-b") is None
    assert await ids(view, tenant="u") == ["ann-u"]


async def test_erasing_an_agent_drops_all_of_it_and_a_tenant_every_agent(view):
    from events import AgentRemoved

    await two_members(view)
    await view.apply([subject_ev(AgentRemoved, agent="a"), erased()])
    assert await ids(view) == [] and await view.get("t", "a", "shared") is None
    assert await view.blocks("t", "a") == {} and await view.consents("t", "a") == {}
    assert await view.users("t", "a") == set() and await view.shadowed("t", "a") == set()
    assert (await view.subject("t", "a", None)).agent_removed  # the removal itself stays
    assert await ids(view, "b") == ["ann-b", "bob-b"]
    await view.apply([erased("b", tenant_wide=True)])
    assert await ids(view, "b") == [] and await view.consents("t", "b") == {}
    assert await ids(view, tenant="u") == ["ann-u"]
    if hasattr(view, "expired"):
        assert await view.expired(int((T0 + timedelta(days=2)).timestamp() * 1000)) == {}


async def test_records_purged_drops_every_version_of_the_records_it_names(view):
    from events import RecordsPurged

    await two_members(view)
    await view.apply([ev(RecordDeleted, rec("shared", 2, minute=6, status="DELETED"))])
    purge = RecordsPurged(event_id="p1", command_id="cp", tenant="t", agent="a", occurred_at=T0,
                          record_ids=["shared", "ann3", "ann1", "never"])
    for _ in range(2):
        await view.apply([purge])
        for rid in ("shared", "ann3", "ann1"):
            assert await view.history("t", "a", rid) == [] and await view.get("t", "a", rid, 1) is None
        assert await ids(view) == ["ann-draft", "ann-said", "ann2", "bob1"]
        assert await ids(view, user="ann") == ["ann-draft", "ann2"]
        assert await view.pinned("t", "a") == [] and await view.shadowed("t", "a") == set()
    assert (await view.get("t", "a", "ann2")).summary == "ann2 v1"


async def test_a_purge_in_the_middle_of_a_batch_keeps_what_comes_after_it(view):
    """A member erased, then back with a new fact in the same batch: only the old ones go."""
    await view.apply([ev(RecordAdded, urec("old", "ann", 1)), erased(user="ann"), ev(RecordAdded, urec("new", "ann", 2))])
    assert await ids(view, user="ann") == ["new"] and await view.users("t", "a") == {"ann"}
