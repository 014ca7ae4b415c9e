"""Which history messages a caller can see, by (session, message id): for reads outside a
history search that must apply the same rules (a note's sources at save time and at every
recall).

The rules are a history search's (`HistoryFilter.admits` and the membership windows,
events/rules/history.py): the caller's tenant and agent; a member's message only for an
agent or helper key speaking for that member, never for an operator; a preview message only
for a preview caller; and only what was said while the agent was a member of the session.
One Redis round trip for any number of refs (they are all of one agent, so one slot).
"""

from __future__ import annotations

from dataclasses import replace

from events.rules.history import KINDS_BY_INDEX, HistoryFilter, KeptEvent, within
from projections.redis.history_view import RedisHistory

ALL_KINDS = KINDS_BY_INDEX["messages_and_tools"]


async def visible_messages(history: RedisHistory, ctx, refs: list[tuple[str, str]], preview: bool = False,
                           kinds: tuple[str, ...] = ALL_KINDS, text: bool = True) -> dict[tuple[str, str], KeptEvent]:
    """The events of `refs` ((session, message id)) that `ctx` (services.memory.Context) can
    see, keyed by ref; a ref missing from the answer is deleted, erased or not visible.

    `preview`: whether preview messages count as visible (a preview caller's, `ctx.preview`,
    always do). `kinds`: which kinds of event count (default every kind). `text=False`: the
    events without their texts, for a check alone (a recall's notes)."""
    f = HistoryFilter(tenant=ctx.tenant, agent=ctx.agent, session=None, preview=preview or ctx.preview,
                      kinds=kinds, user=ctx.user, operator=ctx.principal.role == "operator")
    return await admitted(history, f, refs, text)


async def admitted(history: RedisHistory, f: HistoryFilter, refs: list[tuple[str, str]], text: bool = True
                   ) -> dict[tuple[str, str], KeptEvent]:
    """The events of `refs` ((session, message id), all of `f`'s agent) that `f` admits, each
    in its own session, and said while the agent was a member of it: the one place the rule
    of a read by id lives (a history search's `ids` and `visible_messages` both come here)."""
    if not refs:
        return {}
    events, windows = await history.get_refs(f.tenant, f.agent, refs, text)
    return {ref: e for ref, e in events.items()
            if replace(f, session=ref[0]).admits(e) and within(windows.get(ref[0]), e.occurred_ms)}
