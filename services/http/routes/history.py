"""Session history over HTTP: `search_history(query, ids, limit)` with its filters.

An API extension (services/http/app.py, `extensions()`): it owns the history Edge shard and
runs its projection in this process; whole events and listings come from the Redis side
that `memlane worker history` keeps.

Boundaries: a search sees one session (X-Session) of the key's agent, never another;
without a session there is no history. Where the agent's configuration allows it
(`harness.history.across_conversations`), `scope: "agent"` searches every session of the
agent, and `GET /v1/history/messages` reads another session than the caller's
(docs/features/session-history.md). Whatever the scope, only what the agent could see: in a
group conversation, what was said while it was a member (`MembershipChanged`). A member's turns (the turn's `user`) are found only
by the agent or helper key speaking for that member (X-User), never by an operator, on any
agent. A live turn never sees what a preview turn kept.
With a current turn (X-Turn header or `turn`), only earlier turns are searched, which is
also how a replayed turn sees the history its original turn saw. `harness.history` must
be set: an agent without it has history search off. On an agent whose members' consent
is required (`memory.consent`), a session's transcript is its member's: an operator key never
searches it, and an agent or helper key is asked the subject rule first (consent, channel,
removal: `events.rules.subjects`), as for memory. Each search is recorded on
`memlane.usage` as `Retrieved` (a RETRIEVED output use), and its query embedding as
`ModelUsage` of purpose `embed`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

import structlog
from fastapi import APIRouter, FastAPI, Query
from pydantic import Field

from events.base import IDENT_PATTERN
from events.config import AgentConfig
from events.errors import ErrorCode
from events.rules import named_time, subjects
from events.rules.history import (
    MAX_RANKED_DEPTH,
    HistoryFilter,
    KeptEvent,
    decode_cursor,
    encode_cursor,
    event_from_payload,
    fingerprint,
    kinds_for,
    render,
    split_parts,
    time_window,
    within,
)
from events.sealing import KeyMissing
from events.usage import Retrieved, RetrievedItem
from projections.qdrant.history_index import HYBRID_DEPTH, HistoryIndex, Mode, Visible
from projections.qdrant.ranking import Place
from projections.redis.history_view import RedisHistory
from services.errors import ApiError
from services.http.deps import Ctx
from services.http.following import HistoryFollowing
from services.http.history_access import admitted
from services.http.models import Body
from services.memory import Context
from services.memory.rules import NOT_MEMBER, check_across, check_enabled, check_role, refused
from settings import Settings
from workers.followers.history_qdrant import HistoryQdrantProjection

log = structlog.get_logger()


class HistorySearchRequest(Body):
    query: Annotated[str, Field(max_length=4000)] | None = None
    ids: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=100)] = []
    limit: Annotated[int, Field(ge=1, le=100)] = 10
    conversation: Annotated[str, Field(max_length=128)] | None = None
    day: str | None = None
    since: Annotated[int, Field(ge=0)] | None = None
    until: Annotated[int, Field(ge=0)] | None = None
    # When the question is asked (Unix ms; default: now), for the times it names: "last week"
    # ranks what was said that week first (`events.rules.named_time`). Not with day/since/until.
    now: Annotated[int, Field(ge=0, le=253402300799999)] | None = None
    cursor: Annotated[str, Field(max_length=512)] | None = None
    turn: Annotated[int, Field(ge=0)] | None = None
    mode: Literal["hybrid", "lexical", "vector"] | None = None
    # A request may name what it searches: "messages" is this history search;
    # "notes" searches the caller's notes by topic and summary (docs/features/notes.md).
    kind: Literal["messages", "notes"] = "messages"
    # "session": the caller's session (X-Session), as always. "agent": every session of the
    # agent, where `harness.history.across_conversations` allows it; `session` then narrows it
    # to one, and each hit names its session as `conversation`.
    scope: Literal["session", "agent"] = "session"
    session: Annotated[str, Field(min_length=1, max_length=128, pattern=IDENT_PATTERN)] | None = None


class HistoryExtension:
    def __init__(self) -> None:
        self.router = APIRouter(tags=["history"])
        self.index: HistoryIndex | None = None
        self.projection: HistoryQdrantProjection | None = None
        self.store: RedisHistory | None = None
        self.task: asyncio.Task | None = None
        self.settings: Settings | None = None
        self.app: FastAPI | None = None
        self.following: HistoryFollowing | None = None
        self.router.add_api_route("/v1/history/search", self.search, methods=["POST"])
        self.router.add_api_route("/v1/history/status", self.status, methods=["GET"])
        self.router.add_api_route("/v1/history/messages", self.messages, methods=["GET"])

    async def start(self, app: FastAPI, settings: Settings) -> None:
        self.settings, self.app = settings, app
        self.following = HistoryFollowing(app, settings)
        self.index, self.projection, self.task = self.following.index, self.following.projection, self.following.task
        self.store = self.following.store
        app.state.history = self

    async def stop(self, app: FastAPI) -> None:
        if self.following is not None:
            await self.following.stop()

    async def status(self) -> dict[str, Any]:
        return self.projection.status() if self.projection else {"caught_up": False}

    async def _config(self, who: Context, what: str) -> AgentConfig:
        """The agent's configuration, once the caller may read its history at all."""
        check_role(who, NOT_MEMBER, what)
        assert self.app is not None and self.settings is not None  # `start` set them before the routes were served
        cfg = await self.app.state.service.config(who.tenant, who.agent)
        # Session history is memory too: with memory off, the agent's calls are refused at once.
        check_enabled(who, cfg, self.settings.memory_kill_switch)
        await self._check_subject(who, cfg)
        if cfg.history is None:
            raise ApiError(
                ErrorCode.HISTORY_DISABLED, "harness.history", "history is off for this agent; set harness.history.index", 403
            )
        return cfg

    async def search(self, body: HistorySearchRequest, who: Ctx) -> dict[str, Any]:
        assert self.app is not None  # `start` set it before the routes were served
        if body.kind == "notes":  # memory_search's kind "notes": the caller's notes by topic and summary
            return await self.app.state.service.notes.search(who, body.query, body.limit, body.cursor)
        cfg = await self._config(who, "search session history")
        turn = body.turn if body.turn is not None else who.turn
        if body.scope == "agent":
            check_across(cfg, "scope", 'scope "agent"')
            return await self._search_agent(body, who, cfg, turn)
        if body.session is not None and body.session != who.session:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "session", 'session: names another session; pass scope "agent" '
                           "(where harness.history.across_conversations allows it), or leave session out")
        if not who.session or not cfg.has_sessions:
            # History stays with a session: an agent without sessions has none.
            await self._record(who, turn, [], embedded=None)
            return {"events": [], "next_cursor": None}
        f = self._filter(body, who, cfg, session=who.session, before_turn=turn)
        return await self._run(f, body, who, cfg, turn)

    @staticmethod
    def _filter(body: HistorySearchRequest, who: Context, cfg: AgentConfig, **where: Any) -> HistoryFilter:
        """A search's filter: the caller's agent, preview, member and role, the kinds history
        keeps, the body's conversation and time window (422 naming the field), and `where` (the
        session and the turn bounds)."""
        try:
            since, until = time_window(body.day, body.since, body.until)
        except ValueError as e:
            field, _, _ = str(e).partition(":")
            raise ApiError(ErrorCode.VALIDATION_FAILED, field, str(e)) from None
        assert cfg.history is not None  # `_config` refused an agent without history
        return HistoryFilter(
            tenant=who.tenant,
            agent=who.agent,
            preview=who.preview,
            kinds=kinds_for(cfg.history.index),
            conversation=body.conversation,
            since_ms=since,
            until_ms=until,
            user=who.user,
            operator=who.principal.role == "operator",
            **where,
        )

    async def _run(self, f: HistoryFilter, body: HistorySearchRequest, who: Context, cfg: AgentConfig,
                   turn: int | None) -> dict[str, Any]:
        if body.ids:
            out, nxt, embedded = await self._read(f, body.ids), None, None
        elif body.query and body.query.strip():
            mode = body.mode or cfg.memory.search.mode
            out, nxt = await self._ranked(f, body, mode)
            embedded = body.query if mode != "lexical" else None
        else:
            out, nxt, embedded = *(await self._list(f, body)), None
        await self._record(who, turn, out, embedded)
        return {"events": out, "next_cursor": nxt}

    async def _search_agent(self, body: HistorySearchRequest, who: Context, cfg: AgentConfig,
                            turn: int | None) -> dict[str, Any]:
        """Every session of the agent (or `session`, one of them). The current turn bounds only
        the caller's own session (`own_turn` across sessions); other sessions' turn numbers are
        not comparable, so they are not bounded by it. Reading by id or listing needs one session."""
        if not cfg.has_sessions:
            await self._record(who, turn, [], embedded=None)
            return {"events": [], "next_cursor": None}
        has_query = bool(body.query and body.query.strip())
        if body.session is None and (body.ids or not has_query):
            field = "ids" if body.ids else "session"
            raise ApiError(ErrorCode.VALIDATION_FAILED, field, f'{field}: with scope "agent", reading by id or listing '
                           "without a query needs one session; name it in session, or give a query")
        f = self._filter(
            body, who, cfg,
            session=body.session,
            before_turn=turn if body.session is not None and body.session == who.session else None,
            own_turn=(who.session, turn) if body.session is None and who.session and turn is not None else None,
        )
        res = await self._run(f, body, who, cfg, turn)
        if body.session is not None:
            for o in res["events"]:
                o["conversation"] = body.session
        return res

    async def messages(
        self,
        who: Ctx,
        conversation: Annotated[str | None, Query(min_length=1, max_length=128, pattern=IDENT_PATTERN)] = None,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 50,
    ) -> dict[str, Any]:
        """`message_history`: one session (default the caller's) oldest first, whole events, paged.
        Another session only where `harness.history.across_conversations` allows it."""
        cfg = await self._config(who, "read session history")
        session = conversation or who.session
        if session is None:
            raise ApiError(ErrorCode.VALIDATION_FAILED, "conversation", "conversation: no session to read; send "
                           "X-Session, or name the conversation (a session id)")
        if session != who.session:
            check_across(cfg, "conversation", f"conversation {session!r} is not the caller's session")
        if not cfg.has_sessions:
            return {"conversation": session, "events": [], "next_cursor": None}
        assert cfg.history is not None  # `_config` refused an agent without history
        assert self.store is not None  # `start` set it before the routes were served
        f = HistoryFilter(
            tenant=who.tenant,
            agent=who.agent,
            session=session,
            preview=who.preview,
            kinds=kinds_for(cfg.history.index),
            before_turn=who.turn if session == who.session else None,
            user=who.user,
            operator=who.principal.role == "operator",
        )
        fp = fingerprint("messages", f)
        after = self._position(cursor, fp, tuple)
        events, nxt = await self.store.in_order(f, limit, after)
        out = [render(e, e.text, None, len(split_parts(e.text))) for e in events]
        await self._record(who, who.turn, out, None)  # a read of history, as a search by ids is
        return {"conversation": session, "events": out, "next_cursor": encode_cursor(list(nxt), fp) if nxt else None}

    async def _check_subject(self, who: Context, cfg: AgentConfig) -> None:
        """On a members' agent (consent required) a transcript is its member's: an operator key
        never searches it, and an agent's or helper's search gets the subject rule first."""
        if not subjects.consent_needed(cfg):
            return
        check_role(who, ("agent", "helper"), "search session history on an agent whose members' consent is "
                   "required: a member's transcript is theirs")
        assert self.app is not None  # `start` set it before the routes were served
        state = await self.app.state.service.records.subject(who.tenant, who.agent, who.user)
        refused(subjects.refusal(cfg, who.user, who.channel, state))

    async def _read(self, f: HistoryFilter, ids: list[str]) -> list[dict[str, Any]]:
        """Whole events by id, within the session, visibility and turn boundaries."""
        assert self.store is not None  # `start` set it before the routes were served
        assert f.session is not None  # reading by id needs one session: both callers make sure of it
        bounds = HistoryFilter(f.tenant, f.agent, f.session, f.preview, f.kinds, f.before_turn, user=f.user,
                               operator=f.operator)
        ids = list(dict.fromkeys(ids))
        found = await admitted(self.store, bounds, [(f.session, i) for i in ids])
        events = [found[(f.session, i)] for i in ids if (f.session, i) in found]
        return [render(e, e.text, None, len(split_parts(e.text))) for e in events]

    async def _ranked(self, f: HistoryFilter, body: HistorySearchRequest, mode: Mode):
        assert self.app is not None and self.store is not None  # `start` set it before the routes were served
        assert body.query is not None  # `_run` ranks only a query
        named = None
        if mode == "hybrid" and f.since_ms is None and f.until_ms is None:
            asked = datetime.fromtimestamp(body.now / 1000, UTC) if body.now is not None else datetime.now(UTC)
            named = named_time.window(body.query, asked)
        window = None if named is None else named.ms()
        fp = fingerprint("q", f, body.query, mode, window)
        offset = self._position(body.cursor, fp, int)
        cap = HYBRID_DEPTH if mode == "hybrid" else MAX_RANKED_DEPTH
        if offset >= cap:
            return [], None
        limit = min(body.limit, cap - offset)
        dense = None
        if mode != "lexical":
            dense = (await self.app.state.service.fair.embed(f.tenant, [body.query]))[0]  # in the tenant's turn
        # Hits said while the agent was not a member of their session are left out here (the
        # windows live in Redis), so a page reads on until it is full; the cursor is the rank
        # of the next hit not yet looked at. A hybrid search leaves them out before ranking too,
        # so that they lift no neighbour (`_visible`).
        # A session search reads its session's windows once, for the ranking and every page.
        known = await self.store.windows(f.tenant, f.agent, [f.session]) if f.session is not None else None
        visible = self._visible(f, known) if mode == "hybrid" else None
        out: list[dict[str, Any]] = []
        pos, more = offset, False
        while pos < cap:
            want = min(max(limit - len(out) + 1, 32), cap - pos + 1)
            hits = await self._hits(f, dense, body.query, want, pos, mode, visible, window)
            events = [event_from_payload(h.payload) for h in hits]
            windows = known if known is not None else await self.store.windows(
                f.tenant, f.agent, [e.session for e in events])
            for h, e in zip(hits, events, strict=True):
                if pos >= cap:
                    break
                # Not visible, or of the caller's own session at or after its turn (a search
                # across sessions; the Qdrant filter bounds no single session by the turn).
                if not within(windows.get(e.session), e.occurred_ms) or not f.bounds_own(e):
                    pos += 1
                    continue
                if len(out) == limit:
                    more = True
                    break
                out.append(self._hit(f, e, h))
                pos += 1
            if more or len(hits) < want or pos >= cap:
                break
        return out, (encode_cursor(pos, fp) if more else None)

    async def _hits(self, f: HistoryFilter, dense, query: str, n: int, offset: int, mode: Mode,
                    visible: Visible | None = None, window: tuple[int, int] | None = None) -> list[Any]:
        assert self.store is not None  # `start` set it before the routes were served
        # A session search runs in the event loop when the shard is free: the Edge shard holds
        # the interpreter lock while it searches, so a thread runs none of it in parallel, and
        # handing each search to a thread and back made searches wait on one another
        # (docs/decisions/0019-history-ranking-score-fusion.md). Across sessions the search asks the loop for membership
        # windows midway, so it runs in a thread, as does any search that would wait for the shard.
        async def search(missing_ok: bool) -> list[Any]:
            assert self.index is not None  # `start` set it before the routes were served
            args = (f, dense, query, n, offset, mode, missing_ok, visible, window)
            if f.session is not None and (hits := self.index.search_now(*args)) is not None:
                return hits
            return await asyncio.to_thread(self.index.search, *args)

        try:
            return await search(False)
        except KeyMissing:
            # A part sealed under a key published since this process last caught up.
            if self.store.keys is not None:
                await self.store.keys.catch_up()
            return await search(True)

    def _visible(self, f: HistoryFilter, known: dict[str, Any] | None) -> Visible | None:
        """Which candidates the caller may see: said while the agent was a member, and not of
        its own session at or after its turn. `known`: a session search's windows, read
        already; None back: all of them (the agent was always a member of that session)."""
        # `known` is read for a session search only, so with it `f.session` is set.
        if known is not None and known.get(cast(str, f.session)) is None and f.own_turn is None:
            return None
        loop = asyncio.get_running_loop()

        def of(places: list[Place]):  # across sessions, on the search's thread: their windows through the loop
            assert self.store is not None  # `start` set it before the routes were served
            windows = known if known is not None else asyncio.run_coroutine_threadsafe(
                self.store.windows(f.tenant, f.agent, sorted({p.session for p in places})), loop).result(timeout=30)
            return lambda p: within(windows.get(p.session), p.at_ms) and f.bounds_turn(p.session, p.turn)

        return of

    @staticmethod
    def _hit(f: HistoryFilter, e: KeptEvent, h: Any) -> dict[str, Any]:
        out = render(e, h.payload["text"], h.payload["part"], h.payload["parts"], h.score)
        if f.session is None:
            out["conversation"] = e.session  # across conversations: which one it was said in
        return out

    async def _list(self, f: HistoryFilter, body: HistorySearchRequest) -> tuple[list[dict[str, Any]], str | None]:
        """Without a query: the session's events newest first, the first part of each."""
        assert self.store is not None  # `start` set it before the routes were served
        fp = fingerprint("list", f)
        after = self._position(body.cursor, fp, tuple)
        events, nxt = await self.store.page(f, body.limit, after)
        out = []
        for e in events:
            parts = split_parts(e.text)
            out.append(render(e, parts[0], 1, len(parts)))
        return out, (encode_cursor(list(nxt), fp) if nxt else None)

    @staticmethod
    def _position(cursor: str | None, fp: str, kind: type) -> Any:
        if not cursor:
            return 0 if kind is int else None
        try:
            pos = decode_cursor(cursor, fp)
            return int(pos) if kind is int else (int(pos[0]), str(pos[1]))
        except (ValueError, TypeError, IndexError, KeyError, OverflowError) as e:
            msg = str(e) if str(e).startswith("cursor:") else "cursor: not a cursor this search returned"
            raise ApiError(ErrorCode.VALIDATION_FAILED, "cursor", msg) from None

    async def _record(self, who: Context, turn: int | None, out: list[dict[str, Any]], embedded: str | None) -> None:
        """Each search is a RETRIEVED output use; its query embedding is usage of purpose `embed`."""
        assert self.app is not None  # `start` set it before the routes were served
        usage = self.app.state.service.usage
        t0 = time.perf_counter()
        # Enqueued, not awaited: the recorder delivers in the background, and search latency stays low.
        await usage.record(Retrieved(**usage.base(who, turn), tool="search_history",
                                     items=[RetrievedItem(id=o["id"]) for o in out]))
        if embedded:
            await usage.embedded(who, embedded, turn=turn)
        log.debug("history_search_recorded", items=len(out), ms=round((time.perf_counter() - t0) * 1000, 2))
