"""The member's and the operator's views of members' facts: a member's list of their own
(USER) facts, the operator's listing without them, and the operator's per-member counts.

Each reads the record view's listings directly; the caller (`MemoryReads`) has already checked
the key, whether memory is on and the subject.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from events.record import LIVE, MemoryRecord, Scope
from events.rules.ledger import RESERVED_KINDS
from projections.records import Page, encode_cursor, sort_score
from services.memory.context import Context
from services.memory.rules import check_role, members_data, readable_by

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords


MEMBER_LIST = 200  # a member's list shows up to 200 live facts
# A listing that skips records (an operator's skips members' facts) reads the listing this
# many records a page, and at most `WALK_BUDGET` records a call: a page may come back short,
# with a cursor to read on from. A member's list and the operator's counts read the member's
# own listing (the record view's, by `user`), not the agent's; the counts `WALK_PAGE` records
# a page, `SUBJECT_WALKS` members at a time.
WALK_PAGE = 500
WALK_BUDGET = 10_000
SUBJECT_WALKS = 16


async def subjects(records: RedisRecords, ctx: Context) -> list[dict[str, Any]]:
    """For an operator: every member of the agent who has live user-scope records or a
    consent state, with their count of live facts as the live-fact cap counts them (ACTIVE,
    PENDING, CONFLICT; not episodes or procedures, which are not facts) and their consent
    ("granted", "withdrawn" or None). Never a fact's text.

    Cost: it walks each member's own listing (the members who have or had user-scope
    records, `WALK_PAGE` records a page, `SUBJECT_WALKS` members at a time), so it is
    O(the members' live records), whatever else the agent holds; a per-subject count kept
    by the record view would make it one read per member."""
    check_role(ctx, ("operator",), "list an agent's members and their counts")
    users, consents = await asyncio.gather(records.users(ctx.tenant, ctx.agent),
                                           records.consents(ctx.tenant, ctx.agent))
    walks = asyncio.Semaphore(SUBJECT_WALKS)

    async def count(user: str) -> int | None:
        """The member's live facts, or None when they have no live record of their own."""
        facts, live, cursor = 0, False, None
        async with walks:
            while True:
                page = await records.page(ctx.tenant, ctx.agent, WALK_PAGE, cursor, user=user)
                for r in page.records:
                    if r.scope is Scope.USER and r.user == user and not r.preview and r.status in LIVE:
                        live = True
                        facts += r.kind not in RESERVED_KINDS  # a member with episodes only is listed, at 0
                cursor = page.next_cursor
                if not cursor:
                    return facts if live else None

    walked = sorted(users)
    counts = {u: n for u, n in zip(walked, await asyncio.gather(*(count(u) for u in walked))) if n is not None}
    return [{"user": u, "facts": counts.get(u, 0), "consent": consents.get(u)}
            for u in sorted(set(counts) | set(consents))]


async def operator_page(records: RedisRecords, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
    """An operator's page of the agent's listed records: every session's and preview records
    but no member's data (`rules.members_data`)."""
    # Most records are the operator's to see: read little more than a page.
    return await walk(records, ctx, first, after, ascending, lambda r: not members_data(ctx, r),
                      chunk=min(first + 1, WALK_PAGE))


async def member_page(records: RedisRecords, ctx: Context, first: int, after: str | None, ascending: bool) -> Page:
    """A member's page of their own live facts (pending and conflicting ones too), at most
    `MEMBER_LIST` a page."""
    # The member's own listing: their user-scope records, of which it skips only
    # preview ones (and a preview's deletions), so a page reads little more than itself.
    # (Cost: O(the page), whatever else the agent holds.)
    first = min(first, MEMBER_LIST)
    return await walk(records, ctx, first, after, ascending, lambda r: r.status in LIVE and readable_by(ctx, r),
                      chunk=first + 1, user=ctx.user)


async def walk(records: RedisRecords, ctx: Context, first: int, after: str | None, ascending: bool,
               keep: Callable[[MemoryRecord], bool], chunk: int = WALK_PAGE, user: str | None = None) -> Page:
    """Up to `first` of the agent's listed records (with `user`, of that member's listing)
    that `keep` accepts, by creation time. Reads the listing `chunk` records at a time and
    at most `WALK_BUDGET` a call; the cursor goes on from the last record returned, or,
    when the budget ran out first, from the last record read."""
    out: list[MemoryRecord] = []
    cursor, read, last = after, 0, None
    while True:
        page = await records.page(ctx.tenant, ctx.agent, chunk, cursor, ascending=ascending, user=user)
        for r in page.records:
            read, last = read + 1, r
            if keep(r):
                out.append(r)
                if len(out) > first:
                    return Page(out[:first], encode_cursor(sort_score(out[first - 1]), out[first - 1].id))
        cursor = page.next_cursor
        if not cursor:
            return Page(out, None)
        if read >= WALK_BUDGET:
            assert last is not None  # a page was read, so its last record is set
            return Page(out, encode_cursor(sort_score(last), last.id))
