"""The Memory tab's pages: sign-in, a member's view (consent, their facts, why a fact exists)
and an operator's (agents, counts, members, pipeline health).

Pages are read-only renderings of the same service reads the JSON API answers with; every
change a page offers is a form its script sends to the JSON API itself (app.js).
"""

from __future__ import annotations

import functools
import gzip
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from events.errors import ErrorCode
from services.auth import Principal
from services.errors import ApiError
from services.http.deps import checked_agent, checked_user, resolve_context
from services.http.sessions import COOKIE, SESSION_TTL_S, WebSession, WebSessions
from services.memory import overview
from services.memory.member_reads import MEMBER_LIST
from settings import Settings
from workers.followers.past_memory import Point
from workers.followers.web_sessions_follower import WebSessionLog

HERE = Path(__file__).parent
# What a page may load and do: its own script and style only, so text that slipped past
# escaping still could not run, and no other site may frame it.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors' older spelling, for browsers that predate it
    # Not no-referrer: under it Chromium sends `Origin: null` with the page's own form posts,
    # and sign-in checks that Origin.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
MAX_SIGN_IN_BYTES = 4096

# The page's own two files, read once: nothing else under /ui/static is served.
STATIC = {name: ((HERE / "static" / name).read_bytes(), media)
          for name, media in (("app.js", "text/javascript"), ("app.css", "text/css"))}

templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                               undefined=jinja2.StrictUndefined)


async def past_records(svc: Any, ctx: Any, as_of: str) -> Any:
    """The agent's records as they stood at `as_of` (the operator view's picker)."""
    try:
        point = Point.parse(as_of)
    except ValueError as e:
        raise ApiError(ErrorCode.VALIDATION_FAILED, "as_of", str(e), 422) from None
    return await svc.past_view(ctx, point)


def render(request: Request, name: str, session: WebSession | None, status: int = 200, **values: Any) -> Response:
    html = templates.get_template(name).render(
        who=session.principal if session else None, csrf=session.csrf if session else "", **values).encode()
    if "gzip" not in request.headers.get("accept-encoding", ""):
        return HTMLResponse(html, status_code=status, headers=HEADERS)
    # A member's 200 facts are ~300 KB of HTML and a tenth of that compressed: pages only, the
    # JSON API's hot paths stay uncompressed.
    return HTMLResponse(gzip.compress(html, 5), status_code=status,
                        headers={**HEADERS, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"})


def to_sign_in() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=303)


def same_origin(request: Request) -> bool:
    """A form posted from another site (a browser names it in Origin) is refused: no one signs a
    visitor in as themselves, or out, from elsewhere."""
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


async def signed_in(request: Request) -> WebSession | None:
    return await request.app.state.web_sessions.get(request.cookies.get(COOKIE))


def as_page(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """A page's refusal (a bad `agent` or `tenant`, a record one may not read) as a page that
    names the field, not the API's JSON body."""

    @functools.wraps(handler)
    async def page(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(request, *args, **kwargs)
        except ApiError as e:
            return render(request, "error.html", await signed_in(request), e.status, error=e.message)

    return page


class WebExtension:
    """Serves /ui: its sessions go to their log, then to the API's Redis beside the keys they stand for."""

    def __init__(self) -> None:
        self.router = APIRouter(include_in_schema=False)
        r = self.router
        r.add_api_route("/", lambda: RedirectResponse("/ui", status_code=307), methods=["GET"])
        # Browsers ask for an icon; none, and no 404 in the console.
        r.add_api_route("/favicon.ico", lambda: Response(status_code=204), methods=["GET"])
        r.add_api_route("/ui", self.home, methods=["GET"])
        r.add_api_route("/ui/session", self.sign_in, methods=["POST"])
        r.add_api_route("/ui/signout", self.sign_out, methods=["POST"])
        r.add_api_route("/ui/member", as_page(self.member), methods=["GET"])
        r.add_api_route("/ui/member/facts/{rid}", as_page(self.fact), methods=["GET"])
        r.add_api_route("/ui/operator", as_page(self.operator), methods=["GET"])
        r.add_api_route("/ui/static/{name}", self.static, methods=["GET"])

    async def start(self, app: FastAPI, settings: Settings) -> None:
        keys = app.state.keys
        # Read to the end before serving: the book answers for a session Redis has lost.
        self.log = WebSessionLog(settings)
        await self.log.start()
        app.state.web_sessions = WebSessions(keys.r, keys, settings.redis_root, self.log)

    async def stop(self, app: FastAPI) -> None:
        await self.log.stop()

    async def home(self, request: Request) -> Response:
        session = await signed_in(request)
        if session is None:
            return render(request, "signin.html", None, error=None)
        return RedirectResponse(f"/ui/{session.principal.role}", status_code=303)  # a WEB_ROLES role

    async def sign_in(self, request: Request) -> Response:
        if not same_origin(request):
            return render(request, "signin.html", None, 403, error="sign in from this server's own page (/ui)")
        raw = await request.body()
        key = parse_qs(raw[:MAX_SIGN_IN_BYTES].decode("utf-8", "replace")).get("key", [""])[0].strip()
        made = await request.app.state.web_sessions.sign_in(key) if key else None
        if made is None:
            return render(request, "signin.html", None, 401, error="key: no such key; check it, or ask your operator for a "
                          "member key")
        if isinstance(made, Principal):
            return render(request, "signin.html", None, 403, error=f"key: an {made.role} key does not sign in here; sign "
                          "in with a member key (your facts) or an operator key (your agents)")
        sid, _ = made
        out = RedirectResponse("/ui", status_code=303)
        out.set_cookie(COOKIE, sid, max_age=SESSION_TTL_S, httponly=True, samesite="strict", path="/",
                       secure=request.url.scheme == "https")
        return out

    async def sign_out(self, request: Request) -> Response:
        session = await signed_in(request)
        raw = await request.body()
        sent = parse_qs(raw[:MAX_SIGN_IN_BYTES].decode("utf-8", "replace")).get("csrf", [""])[0]
        if session is not None and same_origin(request) and secrets.compare_digest(sent.encode(), session.csrf.encode()):
            await request.app.state.web_sessions.sign_out(request.cookies.get(COOKIE))
        out = to_sign_in()
        out.delete_cookie(COOKIE, path="/")
        return out

    async def static(self, name: str) -> Response:
        if name not in STATIC:
            return Response("no such file", status_code=404, media_type="text/plain")
        body, media = STATIC[name]
        return Response(body, media_type=media, headers={"Cache-Control": "max-age=300",
                                                         "X-Content-Type-Options": "nosniff"})

    # ------------------------------------------------------------------ member

    async def member(self, request: Request, agent: str | None = None) -> Response:
        session = await signed_in(request)
        if session is None or session.principal.role != "member":
            return to_sign_in()
        p, svc = session.principal, request.app.state.service
        names = [p.agent] if p.agent else await svc.records.agents(p.tenant)
        agent = checked_agent(agent, "agent") if agent else (names[0] if names else None)
        if agent is not None and agent not in names:
            return render(request, "member.html", session, 404, consents=[], agent=None, facts=[], more=False,
                          facts_error=None)
        consents = [await svc.consent(resolve_context(p, a, None, None, False)) for a in names]
        facts, more, error = [], False, None
        if agent:
            try:
                page = await svc.reads.memories(resolve_context(p, agent, None, None, False), MEMBER_LIST, None, False)
                facts, more = page.records, page.next_cursor is not None
            except ApiError as e:
                error = e.message
        return render(request, "member.html", session, consents=consents, agent=agent, facts=facts, more=more,
                      facts_error=error)

    async def fact(self, request: Request, rid: str, agent: str | None = None) -> Response:
        session = await signed_in(request)
        if session is None or session.principal.role != "member":
            return to_sign_in()
        p, svc = session.principal, request.app.state.service
        ctx = resolve_context(p, checked_agent(agent, "agent"), None, None, False)
        try:
            versions = await svc.reads.history(ctx, rid)
        except ApiError as e:
            return render(request, "member.html", session, e.status, consents=[], agent=ctx.agent, facts=[], more=False,
                          facts_error=e.message)
        recalls = (await request.app.state.activity.recalls_of(ctx.tenant, ctx.agent, [rid]))[rid]
        return render(request, "fact.html", session, agent=ctx.agent, versions=versions, current=versions[0],
                      recalls=recalls)

    # ------------------------------------------------------------------ operator

    async def operator(self, request: Request, tenant: str | None = None, agent: str | None = None,
                       as_of: str | None = None) -> Response:
        session = await signed_in(request)
        if session is None or session.principal.role != "operator":
            return to_sign_in()
        p, svc = session.principal, request.app.state.service
        tenant = p.tenant if p.tenant != "*" else checked_user(tenant or None, "tenant")
        agents = await overview.agents(svc, tenant) if tenant else []
        agent = checked_agent(agent, "agent") if agent else (agents[0]["agent"] if agents else None)
        view, error = None, None
        if tenant and agent:
            ctx = resolve_context(p, agent, tenant, None, False)
            try:
                records = await past_records(svc, ctx, as_of) if as_of else None
                view = await overview.overview(svc, ctx, records)
            except ApiError as e:
                error = e.message
        pipeline = await self._pipeline(request, session, tenant)
        return render(request, "operator.html", session, tenant=tenant, agents=agents, agent=agent, overview=view,
                      overview_error=error, pipeline=pipeline, as_of=as_of)

    async def _pipeline(self, request: Request, session: WebSession, tenant: str | None) -> dict[str, Any] | None:
        from services.pipeline_status import pipeline_status

        st = request.app.state
        return await pipeline_status(st.settings, st.health, st.shards, st.activity, tenant,
                                     session.principal.deployment)
