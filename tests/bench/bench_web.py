"""web: the Memory tab's member view, in a real browser (docs/features/memory-tab.md).

`member_view_load_ms`: a member with `FACTS` live facts (written over HTTP with the agent's
key, after the member granted consent) signs in through the sign-in form in headless Chromium
(Debian's, driven by Playwright), then loads `/ui/member` `LOADS` times after `WARMUP`
discarded loads. Each load is timed by the browser's own navigation timing (start of the
navigation to the end of the load event: the server's render, the transfer, parsing, the
script and style). Before a figure is printed, every load must show exactly `FACTS` fact
rows and the first and last facts' text. `member_view_bytes`: what a first visit downloads
(the bodies of the page, its style and its script, as sent: the page gzipped), the page's
HTML alone compressed and not, and what the browser fetched after signing in (the script and
style were cached by the sign-in page).
"""

from __future__ import annotations

import os

from playwright.async_api import async_playwright

from events.config import member_facts
from services.client import MemlaneClient
from tests.bench.common import bench_stack, figure, median, percentile, progress
from tests.e2e.browser_support import launch_chromium

SCALE = float(os.environ.get("MEMLANE_BENCH_WEB_SCALE", "1"))
FACTS = 200  # a member's list shows up to 200 live facts
LOADS = max(5, int(50 * SCALE))
WARMUP = 5
TENANT, AGENT, USER = "webbench", "helpdesk", "alice"


def fact(i: int) -> str:
    return f"Fact number {i:03d}: prefers window seats and tea with oat milk in the morning"


async def _load_facts(stack, settings) -> str:
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=TENANT, agent=AGENT) as op:
        await op.configure(member_facts())
        agent_key = await op.issue_key(TENANT, AGENT)
        member_key = await op.issue_key(TENANT, AGENT, "member", USER)
    async with MemlaneClient(stack.api_url, member_key, agent=AGENT) as m:
        await m._call("POST", "/v1/consent")
    async with MemlaneClient(stack.api_url, agent_key, user=USER, session="s1") as a:
        for i in range(FACTS):
            await a.add_memory(fact(i), kind="profile", scope="USER", key=f"fact{i:03d}")
    return member_key


async def run() -> None:
    with bench_stack("web", workers=("ledger", "redis-projection", "embedding")) as (stack, settings):
        member_key = await _load_facts(stack, settings)
        progress(f"{FACTS} facts written; loading the member view {WARMUP}+{LOADS} times")
        async with async_playwright() as pw:
            browser = await launch_chromium(pw)
            try:
                page = await browser.new_page()
                await page.goto(f"{stack.api_url}/ui")
                await page.get_by_label("API key").fill(member_key)
                await page.get_by_role("button", name="Sign in").click()
                await page.wait_for_url("**/ui/member")
                first = await page.evaluate(
                    "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
                    ".map(e => ({name: e.name, transfer: e.transferSize, body: e.encodedBodySize, "
                    "decoded: e.decodedBodySize}))")
                times = []
                for i in range(WARMUP + LOADS):
                    await page.goto(f"{stack.api_url}/ui/member", wait_until="load")
                    rows = page.locator("#facts tr[data-fact]")
                    assert await rows.count() == FACTS, await rows.count()
                    texts = await page.locator("#facts .summary").all_inner_texts()
                    assert fact(0) in texts and fact(FACTS - 1) in texts
                    ms = await page.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0];"
                                             " return n.loadEventEnd - n.startTime; })()")
                    assert ms > 0
                    if i >= WARMUP:
                        times.append(ms)
            finally:
                await browser.close()
    names = [e["name"].rsplit("/", 1)[-1] for e in first]
    assert any(n.startswith("member") for n in names) and "app.js" in names and "app.css" in names, names
    html = next(e for e in first if e["name"].endswith("/ui/member"))
    figure("member_view_load_ms", percentile(times, 95), "ms", LOADS, stat="p95", median=round(median(times), 2),
           facts=FACTS)
    # Bodies as sent (the page gzipped), whether or not the script and style came from the
    # cache the sign-in page filled: what a first visit downloads, headers aside.
    figure("member_view_bytes", sum(e["body"] for e in first), "bytes", 1, facts=FACTS,
           html_bytes=html["body"], html_uncompressed_bytes=html["decoded"], files=len(first),
           transferred_after_sign_in=sum(e["transfer"] for e in first))
