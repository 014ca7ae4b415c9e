"""Signing in to the Memory tab over HTTP: the cookie's flags, refusals, and a session that
ends with its key. (The pages themselves are driven in a real browser: test_memory_tab.)"""

from __future__ import annotations

import uuid

import httpx

from services.client import MemlaneClient


async def _member_key(stack, settings) -> tuple[str, str, str]:
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        await op.configure({})
        entry = await op.issue_key_entry(tenant, agent, "member", "alice")
    return tenant, entry["key"], entry["id"]


async def test_sign_in_sets_a_strict_http_only_cookie_and_never_echoes_the_key(stack, settings):
    _, key, _ = await _member_key(stack, settings)
    async with httpx.AsyncClient(base_url=stack.api_url) as h:
        r = await h.post("/ui/session", data={"key": key})
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and key.lower() not in cookie
        page = await h.get("/ui/member")
        assert page.status_code == 200 and key not in page.text
        # A bad parameter is a page naming it, not the API's JSON.
        bad = await h.get("/ui/member", params={"agent": "no such/agent"})
        assert bad.status_code == 422 and bad.headers["content-type"].startswith("text/html")
        assert "agent: an id is 1 to 128" in bad.text
        assert "default-src 'none'" in page.headers["content-security-policy"]


async def test_a_wrong_key_a_foreign_origin_and_an_agent_key_are_refused_with_what_to_do(stack, settings, new_agent):
    _, key, _ = await _member_key(stack, settings)
    _, _, agent_key = await new_agent()
    async with httpx.AsyncClient(base_url=stack.api_url) as h:
        r = await h.post("/ui/session", data={"key": "ml_m_nope"})
        assert r.status_code == 401 and "no such key" in r.text and "set-cookie" not in r.headers
        r = await h.post("/ui/session", data={"key": key}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "set-cookie" not in r.headers
        # A program's key gets no session at all: its cookie would carry it to the API.
        r = await h.post("/ui/session", data={"key": agent_key})
        assert r.status_code == 403 and "sign in with a member key" in r.text and "set-cookie" not in r.headers
        assert (await h.get("/ui")).status_code == 200 and "memlane_session" not in h.cookies
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"


async def test_revoking_the_key_or_signing_out_ends_the_session(stack, settings):
    tenant, key, kid = await _member_key(stack, settings)
    async with httpx.AsyncClient(base_url=stack.api_url) as h, \
            MemlaneClient(stack.api_url, settings.operator_key) as op:
        await h.post("/ui/session", data={"key": key})
        assert (await h.get("/ui/member")).status_code == 200
        await op.revoke_key(kid, tenant)
        r = await h.get("/ui/member")
        assert r.status_code == 303 and r.headers["location"] == "/ui"

        _, key, _ = await _member_key(stack, settings)
        await h.post("/ui/session", data={"key": key})
        page = await h.get("/ui/member")
        csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
        sid = h.cookies["memlane_session"]
        r = await h.post("/ui/signout", data={"csrf": csrf})
        assert r.status_code == 303
        # The server forgot the session: its cookie, sent again, signs no one in.
        async with httpx.AsyncClient(base_url=stack.api_url, cookies={"memlane_session": sid}) as again:
            assert (await again.get("/ui/member")).status_code == 303
