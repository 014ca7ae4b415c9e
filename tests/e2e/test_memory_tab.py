"""The Memory tab (`/ui`, services/web) in a real Chromium against a real stack: API and workers
as processes, Kafka, Redis, and the scripted fake model server as the only double.

A member signs in with their key, grants consent, sees the facts extraction made from their
turns, edits and deletes them, reads why a fact exists and how often it was recalled, and
withdraws consent; an operator sees the pipeline's dead letters and lags and an agent's
members by count only, and erases one. After each step the page is compared with what the
JSON API answers for a Bearer key. Neither key ever shows in a URL or in a page, a fact's
text is shown as text, and a call made with the session cookie needs the page's CSRF token.

One stack and one agent serve the module; each test speaks for its own member, except the
operator's, which erases alice (and so runs last).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from playwright.async_api import Dialog, Page, expect
from playwright.async_api import Error as PlaywrightError

from events.config import member_facts
from events.topics import COMMANDS
from services.client import TurnPublisher
from tests.conftest import eventually
from tests.e2e.browser_support import browser, console_errors, page, shots_dir  # noqa: F401
from tests.e2e.extraction_support import new_agent, send_poison_command
from tests.e2e.test_consent_extraction import answer, cand, marker, member_turn

CHANNEL = "studio"  # one of member_facts()'s channels (events.config.DEFAULT_CHANNELS)
MEMBERS = ("alice", "carol", "dave")
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@pytest.fixture(scope="module")
def wstack(model_stack):
    return model_stack

@dataclass
class World:
    """The module's agent (configured as member_facts()), its agent key and a member key per user."""

    base: str
    settings: Any
    tenant: str
    agent: str
    agent_key: str
    members: dict[str, str] = field(default_factory=dict)

    async def call(self, key: str, method: str, path: str, *, user: str | None = None, agent: bool = True,
                   tenant: bool = False, session: str | None = None, json: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        if agent:
            headers["X-Agent"] = self.agent
        if tenant:
            headers["X-Tenant"] = self.tenant
        if user:
            headers["X-User"] = user
        if session:
            headers |= {"X-Session": session, "X-Channel": CHANNEL}
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as h:
            return await h.request(method, path, headers=headers, json=json)

    async def ok(self, key: str, method: str, path: str, **kw) -> Any:
        r = await self.call(key, method, path, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json()

    # What the JSON API says, read with the member's own key.
    async def consent(self, user: str) -> str | None:
        return (await self.ok(self.members[user], "GET", "/v1/consent"))["consent"]

    async def facts(self, user: str) -> list[dict[str, Any]]:
        return (await self.ok(self.members[user], "GET", "/v1/memory?first=200"))["records"]

    async def fact(self, user: str, rid: str) -> dict[str, Any]:
        return await self.ok(self.members[user], "GET", f"/v1/memory/{quote(rid, safe='')}")

    async def history(self, user: str, rid: str) -> list[dict[str, Any]]:
        return (await self.ok(self.members[user], "GET", f"/v1/memory/{quote(rid, safe='')}/history"))["versions"]

    async def subjects(self) -> dict[str, dict[str, Any]]:
        body = await self.ok(self.settings.operator_key, "GET", "/v1/subjects", tenant=True)
        return {s["user"]: s for s in body["subjects"]}

    async def granted(self, user: str) -> None:
        """The member's consent, granted with their own key (a test's precondition)."""
        if await self.consent(user) != "granted":
            assert (await self.ok(self.members[user], "POST", "/v1/consent"))["consent"] == "granted"

    async def agent_writes(self, user: str, summary: str) -> str:
        """A user-scope fact the agent's tool writes for `user`; its record id."""
        body = await self.ok(self.agent_key, "POST", "/v1/memory", user=user, session=f"s-{user}",
                             json={"summary": summary, "kind": "profile", "scope": "USER"})
        rid = body.get("id") or body.get("record", {}).get("id")
        assert rid, body
        return rid


@pytest.fixture(scope="module")
async def world(wstack) -> World:
    stack, s = wstack
    tenant, agent, agent_key = await new_agent(stack.api_url, s.operator_key, member_facts())
    w = World(stack.api_url, s, tenant, agent, agent_key)
    for user in MEMBERS:
        issued = await w.ok(s.operator_key, "POST", "/v1/admin/keys", agent=False,
                            json={"tenant": tenant, "agent": agent, "role": "member", "user": user})
        assert (issued["role"], issued["user"], issued["agent"]) == ("member", user, agent), issued
        w.members[user] = issued["key"]
    return w


# ---------------------------------------------------------------------------------- the page's parts


async def sign_in(pg: Page, base: str, key: str, lands: str) -> None:
    await pg.goto(f"{base}/ui")
    await pg.get_by_label("API key").fill(key)
    await pg.get_by_role("button", name="Sign in").click()
    try:
        await pg.wait_for_url(f"{base}{lands}")
    except PlaywrightError:
        raise AssertionError(f"signing in did not land on {lands} but on {pg.url}: "
                             f"{(await pg.locator('main').inner_text()).strip()!r}") from None


def consent_cell(pg: Page, agent: str):
    return pg.get_by_test_id(f"consent-{agent}")


def row_of(pg: Page, rid: str):
    return pg.locator(f'#facts tr[data-fact="{rid}"]')


def why_link(pg: Page, rid: str):
    return row_of(pg, rid).get_by_role("link", name=re.compile(r"^Why"))


async def edit(pg: Page, rid: str, text: str) -> None:
    """Edits a fact's text in the page: its row's Edit opens the editor; Save sends it."""
    await row_of(pg, rid).get_by_role("button", name=re.compile(r"^Edit")).click()
    editor = pg.get_by_role("dialog")
    await editor.get_by_label("Fact", exact=True).fill(text)
    await editor.get_by_role("button", name="Save").click()


async def shown_facts(pg: Page) -> dict[str, tuple[str, str, list[str]]]:
    """Per row of #facts: (summary, status, source message ids) as the page shows them."""
    out = {}
    for row in await pg.locator("#facts tbody tr[data-fact]").all():
        rid = await row.get_attribute("data-fact")
        summary = await row.locator(".summary").text_content()
        status = (await row.locator(".badge").text_content()).strip()
        src = await row.locator("td").nth(5).inner_text()
        found = re.search(r"messages (.+)$", src.strip())
        out[rid] = (summary, status, found.group(1).split(", ") if found else [])
    return out


def api_facts(records: list[dict[str, Any]]) -> dict[str, tuple[str, str, list[str]]]:
    return {r["id"]: (r["summary"], r["status"].lower(), r["provenance"].get("source_message_ids") or [])
            for r in records}


async def decided_by(pg: Page) -> list[str]:
    """The "Decided by" column of #versions, one entry a version."""
    return [" ".join(t.split()) for t in await pg.locator("#versions tbody tr td:nth-child(5)").all_inner_texts()]


def decision(version: dict[str, Any]) -> str:
    """What "Decided by" says of a version (the start of it, for an extraction)."""
    p = version["provenance"]
    return {"EXTRACTION": f"extraction by {p['model']}", "MEMBER": "you", "TOOL": "the agent's memory tool",
            "OPERATOR": "an operator"}.get(p["source"], p["source"].lower())


def accept_next_dialog(pg: Page, seen: list[str]) -> None:
    async def accept(d: Dialog) -> None:
        seen.append(d.message)
        await d.accept()

    pg.once("dialog", accept)


# ---------------------------------------------------------------------------------- 1. a member's journey


async def test_a_member_grants_consent_sees_edits_deletes_and_reads_why_of_their_facts(
        wstack, world, fake, page, shots_dir):  # noqa: F811
    _, s = wstack
    w, key = world, world.members["alice"]
    errors = console_errors(page)
    await sign_in(page, w.base, key, "/ui/member")
    consent = consent_cell(page, w.agent)
    await expect(consent).to_have_text(re.compile(r"^never asked"))
    assert await w.consent("alice") is None

    await page.get_by_role("button", name=f"Grant consent to {w.agent}").click()
    await expect(consent).to_have_text(re.compile(r"^granted"))
    await expect(page.get_by_role("button", name=f"Withdraw consent from {w.agent}")).to_be_visible()
    assert await w.consent("alice") == "granted"

    # Her turns, through Kafka, reviewed by the (scripted) model into three facts.
    m = marker()
    said = {"Has a dog called Rex": ["s1-1-0"], "Lives in Lisbon": ["s1-1-2"],
            "Drinks green tea every morning": ["s1-1-0", "s1-1-2"]}
    fake.on(m, answer(*(cand(t, source_message_ids=ids) for t, ids in said.items())))
    async with TurnPublisher(s.kafka_bootstrap, s.topic_prefix) as pub:
        await pub.publish(member_turn(w.tenant, w.agent, "s1", 1, f"My dog is called Rex {m}", "What a good name!",
                                      "I live in Lisbon and drink green tea every morning", "Noted.",
                                      user="alice", channel=CHANNEL))

    async def three():
        recs = await w.facts("alice")
        return recs if len(recs) >= 3 else None

    records = await eventually(three, timeout=60)
    assert {r["summary"]: r["provenance"]["source_message_ids"] for r in records} == said
    assert {r["provenance"]["source"] for r in records} == {"EXTRACTION"}
    await page.reload()
    await expect(page.locator("#facts tbody tr[data-fact]")).to_have_count(3)
    assert await shown_facts(page) == api_facts(records)
    await page.screenshot(path=shots_dir / "member.png", full_page=True)
    by_text = {r["summary"]: r for r in records}

    # Edit one: a new version, made by her.
    old = by_text["Has a dog called Rex"]
    new_text = "Has a dog called Biscuit"
    await edit(page, old["id"], new_text)
    await expect(page.locator("#facts .summary", has_text=new_text)).to_have_count(1)
    await expect(row_of(page, old["id"])).to_have_count(0)
    assert old["summary"] not in await page.locator("#facts").inner_text()
    records = await w.facts("alice")
    [new] = [r for r in records if r["summary"] == new_text]
    assert (new["provenance"]["source"], new["replaces"]) == ("MEMBER", old["id"])
    assert (await w.fact("alice", old["id"]))["status"] == "SUPERSEDED"
    assert await shown_facts(page) == api_facts(records)

    # Why it exists: the edit is hers, the version it replaced the model's.
    await why_link(page, new["id"]).click()
    await page.wait_for_url(re.compile(rf"/ui/member/facts/{re.escape(quote(new['id'], safe=''))}\?"))
    await expect(page.get_by_role("heading", name=new_text)).to_be_visible()
    history = await w.history("alice", new["id"])
    await expect(page.locator("#versions tbody tr")).to_have_count(len(history))
    assert [v["provenance"]["source"] for v in history] == ["MEMBER"]
    assert await decided_by(page) == [decision(v) for v in history] == ["you"]
    await expect(page.locator("#recalled")).to_have_text(re.compile(r"^Never recalled"))
    await page.get_by_role("link", name="see it").click()
    await page.wait_for_url(re.compile(rf"/ui/member/facts/{re.escape(quote(old['id'], safe=''))}\?"))
    # The replaced fact: the model's version, then hers that superseded it.
    history = await w.history("alice", old["id"])
    await expect(page.locator("#versions tbody tr")).to_have_count(len(history))
    assert [(v["version"], v["provenance"]["source"], v["status"]) for v in history] == [
        (2, "MEMBER", "SUPERSEDED"), (1, "EXTRACTION", "ACTIVE")]  # newest first
    assert history[1]["provenance"]["model"] == s.model
    shown = await decided_by(page)  # in the API's order
    assert [d.startswith(decision(v)) for d, v in zip(shown, history, strict=True)] == [True, True], shown
    assert shown[0] == "you" and shown[1].startswith(f"extraction by {s.model}")
    # The page tells the fact's state now: superseded, with a link to the newer fact.
    await expect(page.locator("main .badge").first).to_have_text("superseded")
    await expect(page.get_by_role("link", name="see the newer fact")).to_be_visible()

    # Delete another, after the confirmation.
    await page.get_by_role("link", name=re.compile("^Back to what")).click()
    gone = by_text["Lives in Lisbon"]
    dialogs: list[str] = []
    accept_next_dialog(page, dialogs)
    await page.get_by_role("button", name=f"Delete: {gone['summary']}").click()
    await expect(row_of(page, gone["id"])).to_have_count(0)
    assert dialogs and dialogs[0].startswith("Delete this fact?"), dialogs
    assert (await w.fact("alice", gone["id"]))["status"] == "DELETED"
    records = await w.facts("alice")
    assert len(records) == 2 and await shown_facts(page) == api_facts(records)

    # The agent recalls once in her session; the fact's page counts it.
    recalled = await w.ok(w.agent_key, "POST", "/v1/recall", user="alice", session="s2",
                          json={"conversation": "conv-1", "text": "What is my dog called? Biscuit?"})
    assert "skipped" not in recalled and new["id"] in [r["id"] for r in recalled["workspaceEntries"]], recalled
    await page.goto(f"{w.base}/ui/member/facts/{quote(new['id'], safe='')}?agent={w.agent}")

    for _ in range(40):  # the API's activity view follows the usage topic: about a second
        text = (await page.locator("#recalled").inner_text()).strip()
        if not text.startswith("Never"):
            break
        await asyncio.sleep(0.5)
        await page.reload()
    assert re.match(r"^Recalled 1 time: first \S+, last \S+\.$", text.strip()), text
    counted = await w.ok(key, "GET", f"/v1/memory/{quote(new['id'], safe='')}/recalls")
    assert counted["count"] == 1 and text == f"Recalled 1 time: first {counted['first']}, last {counted['last']}.", (
        text, counted)
    await page.screenshot(path=shots_dir / "fact.png", full_page=True)

    # Withdraw.
    await page.goto(f"{w.base}/ui/member?agent={w.agent}")
    await page.get_by_role("button", name=f"Withdraw consent from {w.agent}").click()
    await expect(consent).to_have_text(re.compile(r"^withdrawn"))
    assert await w.consent("alice") == "withdrawn"
    # Withdrawing deletes nothing: her facts stay, on the page as in the API.
    assert await shown_facts(page) == api_facts(await w.facts("alice"))
    assert errors == []


# ---------------------------------------------------------------------------------- 2. no key in a URL


async def test_neither_a_member_key_nor_an_operator_key_ever_shows_in_a_url_or_a_page(wstack, world, page):  # noqa: F811
    w, key, op_key = world, world.members["carol"], world.settings.operator_key
    requests: list[tuple[str, str]] = []
    page.on("request", lambda r: requests.append((r.method, r.url)))
    pages: list[str] = []
    visited: list[str] = []

    async def keep() -> None:
        pages.append(await page.content())
        visited.append(page.url)

    await sign_in(page, w.base, key, "/ui/member")
    await keep()
    await page.get_by_role("button", name=f"Grant consent to {w.agent}").click()
    await expect(consent_cell(page, w.agent)).to_have_text(re.compile(r"^granted"))
    await keep()
    rid = await w.agent_writes("carol", "Plays the cello on Sundays")
    await page.reload()
    await edit(page, rid, "Plays the cello on Saturdays")
    await expect(page.locator("#facts .summary", has_text="Saturdays")).to_have_count(1)
    await keep()
    await page.locator("#facts").get_by_role("link", name=re.compile("^Why")).click()
    await expect(page.locator("#versions")).to_be_visible()
    await keep()
    await page.go_back()
    accept_next_dialog(page, [])
    await page.get_by_role("button", name="Delete: Plays the cello on Saturdays").click()
    await expect(page.locator("#facts tbody tr[data-fact]")).to_have_count(0)
    await page.get_by_role("button", name=f"Withdraw consent from {w.agent}").click()
    await expect(consent_cell(page, w.agent)).to_have_text(re.compile(r"^withdrawn"))
    await keep()
    # The key is nowhere the page's script could reach it: the cookie is HttpOnly, and not the key.
    assert await page.evaluate("document.cookie") == ""
    stored = await page.evaluate("JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])")
    assert key not in stored
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "memlane_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and key not in cookie["value"]
    csrf = await page.locator('meta[name="csrf-token"]').get_attribute("content")

    async def with_cookie() -> int:
        async with httpx.AsyncClient(base_url=w.base, cookies={cookie["name"]: cookie["value"]}) as h:
            r = await h.get("/v1/consent", headers={"X-CSRF-Token": csrf, "X-Agent": w.agent})
            return r.status_code

    assert await with_cookie() == 200
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_url(f"{w.base}/ui")
    await keep()
    assert await with_cookie() == 401  # signing out ended the session, not just the browser's cookie

    # The operator's key, too.
    await sign_in(page, w.base, op_key, "/ui/operator")
    await page.goto(f"{w.base}/ui/operator?tenant={w.tenant}&agent={w.agent}")
    await keep()

    sign_ins = [u for m, u in requests if "/ui/session" in u]
    assert len(sign_ins) == 2 and all(m == "POST" for m, u in requests if "/ui/session" in u), requests
    assert len(requests) >= 15, requests  # the pages, their script and style, and the API calls
    for secret in (key, op_key):
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            assert not [u for _, u in requests if form in u]
            assert not [u for u in visited if form in u]
            assert not [i for i, html in enumerate(pages) if form in html]


# ---------------------------------------------------------------------------------- 4. a fact's text is text


async def test_a_fact_with_markup_is_shown_as_its_text_and_runs_nothing(wstack, world, page):  # noqa: F811
    w = world
    await w.granted("alice")
    rid = await w.agent_writes("alice", XSS)
    assert (await w.fact("alice", rid))["summary"] == XSS
    errors = console_errors(page)
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))  # not accepted: Playwright dismisses it
    await sign_in(page, w.base, w.members["alice"], "/ui/member")
    row = row_of(page, rid)
    await expect(row).to_have_count(1)
    assert await row.locator(".summary").text_content() == XSS
    await row.get_by_role("button", name=f"Edit: {XSS}").click()
    editor = page.get_by_role("dialog")
    assert await editor.get_by_label("Fact", exact=True).input_value() == XSS
    await editor.get_by_role("button", name="Cancel").click()
    await expect(row.get_by_role("button", name=f"Delete: {XSS}")).to_have_count(1)
    assert await page.locator("#facts img, #facts script").count() == 0
    assert await page.evaluate("typeof window.__xss") == "undefined"

    await why_link(page, rid).click()
    await expect(page.locator("#versions")).to_be_visible()
    assert await page.locator("main h2").first.text_content() == XSS
    assert XSS in await page.locator("#versions").inner_text()
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("typeof window.__xss") == "undefined"
    assert dialogs == [] and errors == []


# ---------------------------------------------------------------------------------- 5. CSRF


FETCH = """async ([agent, token]) => {
  const headers = {"X-Agent": agent, "Accept": "application/json"};
  if (token !== null) headers["X-CSRF-Token"] = token;
  const r = await fetch("/v1/consent", {method: "POST", headers, credentials: "same-origin"});
  return {status: r.status, body: await r.json()};
}"""


async def test_a_call_with_the_session_cookie_needs_the_pages_csrf_token(wstack, world, page):  # noqa: F811
    w = world
    await sign_in(page, w.base, w.members["dave"], "/ui/member")
    assert await w.consent("dave") is None
    for token in (None, "", "not-the-token"):
        out = await page.evaluate(FETCH, [w.agent, token])
        assert out["status"] == 403, (token, out)
        assert (out["body"]["error"]["code"], out["body"]["error"]["field"]) == ("FORBIDDEN", "x-csrf-token"), out
        assert "x-csrf-token" in out["body"]["error"]["message"]
    assert await w.consent("dave") is None  # refused, so nothing granted

    token = await page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token
    out = await page.evaluate(FETCH, [w.agent, token])
    assert out["status"] == 200 and out["body"]["consent"] == "granted", out
    assert await w.consent("dave") == "granted"


# ---------------------------------------------------------------------------------- 3. the operator's view


async def test_an_operator_sees_dead_letters_lags_and_members_by_count_and_erases_one(
        wstack, world, page, shots_dir):  # noqa: F811
    _, s = wstack
    w, op_key = world, world.settings.operator_key
    # alice has facts of her own (whatever the tests before left her).
    await w.granted("alice")
    await w.agent_writes("alice", "Prefers the window seat")
    alice_facts = await w.facts("alice")
    assert alice_facts

    # A command that breaks the contract: the ledger dead-letters it.
    sent = await send_poison_command(s, w.tenant, w.agent)

    async def parked():
        body = await w.ok(op_key, "GET", "/v1/admin/pipeline", agent=False)
        ours = [m for m in body["dlq"][COMMANDS.dlq].get("messages", [])
                if m["headers"].get("source_offset") == str(sent.offset)
                and m["headers"].get("source_partition") == str(sent.partition)]
        return (body, ours[0]) if ours else None

    pipeline, letter = await eventually(parked, timeout=60)
    error = letter["headers"]["error"]
    assert error and pipeline["workers"]["ledger"]["alive"]

    errors = console_errors(page)
    dlq_row = page.locator("#dlq tbody tr", has_text=COMMANDS.dlq)
    # The tenant's own operator key: the dead letters' sizes, never their errors (a DLQ spans tenants).
    tenant_op = (await w.ok(op_key, "POST", "/v1/admin/keys", agent=False,
                            json={"tenant": w.tenant, "role": "operator"}))["key"]
    await sign_in(page, w.base, tenant_op, "/ui/operator")
    await page.goto(f"{w.base}/ui/operator?agent={w.agent}")
    await expect(page.locator("#agents")).to_contain_text(w.agent)
    await expect(dlq_row).to_have_count(1)
    assert int(await dlq_row.locator("td").nth(1).inner_text()) >= 1
    assert "deployment's operator only" in await dlq_row.locator("td").nth(2).inner_text()
    assert error not in await page.locator("body").inner_text()
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_url(f"{w.base}/ui")

    # The deployment's key: the errors too.
    await sign_in(page, w.base, op_key, "/ui/operator")
    await page.goto(f"{w.base}/ui/operator?tenant={w.tenant}&agent={w.agent}")
    await expect(page.locator("#agents")).to_contain_text(w.agent)
    await expect(dlq_row).to_have_count(1)
    size = int(await dlq_row.locator("td").nth(1).inner_text())
    assert size >= 1 and size >= pipeline["dlq"][COMMANDS.dlq]["size"]
    assert error in await dlq_row.locator("td").nth(2).inner_text()
    lag = page.locator("#workers [data-testid=lag-ledger]")
    await expect(lag).to_have_count(1)
    assert re.fullmatch(r"\d+", (await lag.inner_text()).strip())
    await expect(page.locator("#workers tbody tr", has_text="ledger").locator("td").nth(1)).to_have_text("yes")

    members = await w.subjects()
    alice = page.locator("#members tbody tr", has=page.locator("td", has_text=re.compile(r"^alice$")))
    await expect(alice).to_have_count(1)
    cells = alice.locator("td")
    assert members["alice"]["facts"] == len(alice_facts)
    await expect(cells.nth(1)).to_have_text(str(members["alice"]["facts"]))
    await expect(cells.nth(2)).to_have_text(members["alice"]["consent"] or "never asked")
    shown_text, html = await page.locator("body").inner_text(), await page.content()
    for f in alice_facts + [{"summary": "Has a dog called Rex"}]:
        assert f["summary"] not in shown_text and f["summary"] not in html, f["summary"]
    await page.screenshot(path=shots_dir / "operator.png", full_page=True)

    dialogs: list[str] = []
    accept_next_dialog(page, dialogs)
    async with page.expect_navigation():  # the page reloads once the API has erased her
        await page.get_by_role("button", name=f"Erase alice's memory on {w.agent}").click()
    assert dialogs and dialogs[0].startswith(f"Erase everything {w.agent} remembers about alice?"), dialogs
    # Nothing of hers is left, and the page says what the API says: an erased member is forgotten,
    # consent included (events/rules/ledger/subject_commands.py, `SubjectErased`).
    assert await w.facts("alice") == [] and await w.consent("alice") != "granted"
    members = await w.subjects()
    if "alice" in members:
        assert members["alice"]["facts"] == 0
        await expect(cells.nth(1)).to_have_text("0")
        await expect(cells.nth(2)).to_have_text(members["alice"]["consent"] or "never asked")
    else:
        await expect(alice).to_have_count(0)
    assert errors == []


async def test_an_operator_undoes_a_command_from_the_tab(wstack, world, page):  # noqa: F811
    from events import AgentConfig

    w, op_key = world, world.settings.operator_key
    config = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
    tenant, agent, key = await new_agent(w.base, op_key, config)
    cid = f"tab-undo-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=w.base, timeout=30, headers={"Authorization": f"Bearer {key}"}) as h:
        r = await h.post("/v1/memory", json={"summary": "Takes the night train on Fridays", "scope": "AGENT",
                                             "command_id": cid})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
    errors = console_errors(page)
    await sign_in(page, w.base, op_key, "/ui/operator")
    await page.goto(f"{w.base}/ui/operator?tenant={tenant}&agent={agent}")
    form = page.locator("#undo")
    await form.get_by_label("Command id").fill(cid)
    # The plan first: it says what the undo would change, and changes nothing.
    await form.get_by_role("button", name="Preview").click()
    await expect(page.locator("#status")).to_have_text("Would take back changes to 1 record.")
    async with httpx.AsyncClient(base_url=w.base, timeout=30, headers={"Authorization": f"Bearer {key}"}) as h:
        assert (await h.get(f"/v1/memory/{rid}")).json()["status"] == "ACTIVE"
    dialogs: list[str] = []
    accept_next_dialog(page, dialogs)
    async with page.expect_navigation():  # the page reloads once the API has undone it
        await form.get_by_role("button", name="Undo").click()
    assert dialogs and dialogs[0].startswith(f"Take back everything it wrote on {agent}?"), dialogs
    async with httpx.AsyncClient(base_url=w.base, timeout=30, headers={"Authorization": f"Bearer {key}"}) as h:
        assert (await h.get(f"/v1/memory/{rid}")).json()["status"] == "DELETED"
        assert (await h.get("/v1/memory")).json()["records"] == []
    assert errors == []


async def test_an_operator_sees_an_agents_records_as_they_stood_before_an_undo(wstack, world, page):  # noqa: F811
    from events import AgentConfig

    w, op_key = world, world.settings.operator_key
    config = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
    tenant, agent, key = await new_agent(w.base, op_key, config)
    async with httpx.AsyncClient(base_url=w.base, timeout=30, headers={"Authorization": f"Bearer {key}"}) as h:
        r = await h.post("/v1/memory", json={"summary": "The office closes at six", "scope": "AGENT",
                                             "command_id": "tab-asof-1"})
        assert r.status_code == 201, r.text
    point = r.headers["X-Memlane-Position"]  # the log's position the write was served at: before its undo
    async with httpx.AsyncClient(base_url=w.base, timeout=30, headers={
            "Authorization": f"Bearer {op_key}", "X-Tenant": tenant, "X-Agent": agent}) as h:
        assert (await h.post("/v1/undo", json={"command_id": "tab-asof-1"})).status_code == 200
    errors = console_errors(page)
    await sign_in(page, w.base, op_key, "/ui/operator")
    await page.goto(f"{w.base}/ui/operator?tenant={tenant}&agent={agent}")
    by_status = page.locator(".card", has_text="Records by status")
    await expect(by_status).to_contain_text("deleted")
    await page.locator("#as-of").get_by_label("Records as of").fill(point)
    await page.locator("#as-of").get_by_role("button", name="Show").click()
    await expect(page.locator("#agent-h")).to_contain_text(f"as of {point}")
    await expect(by_status).to_contain_text("active")
    assert "deleted" not in await by_status.inner_text()
    assert errors == []
