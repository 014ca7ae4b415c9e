"""Real-browser tests: Debian's Chromium driven by Playwright's async API.

No browser is downloaded (`playwright install` cannot reach its hosts): `make install` apt-installs
Debian's `chromium`, and Playwright launches /usr/bin/chromium (or $MEMLANE_CHROMIUM) with flags that
keep it off the network, which is closed here and refuses Chromium's background connections.

A test module imports the fixtures it uses (pytest finds fixtures by name in the module; ruff then
takes the imports for unused, and the test's parameters for redefinitions of them):

    from playwright.async_api import expect

    from tests.e2e.browser_support import browser, console_errors, page, shots_dir  # noqa: F401

    async def test_page(page, shots_dir):  # noqa: F811
        errors = console_errors(page)  # before goto, to catch the page's first errors too
        await page.goto(url)
        await page.get_by_role("button", name="Save").click()
        await expect(page.get_by_role("status")).to_have_text("Saved")
        await page.screenshot(path=shots_dir / "page_saved.png")
        assert errors == []

Screenshots land in .run/screenshots/<run id>/ (and .run/screenshots/latest points at the newest run),
kept after the run for a person to look at; `make clean` removes them with the rest of .run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.async_api import Browser, ConsoleMessage, Error, Page, Playwright, async_playwright

ROOT = Path(__file__).resolve().parents[2]

CHROMIUM = "/usr/bin/chromium"

# Headless, as root (no sandbox), no GPU, and none of Chromium's own connections (component updates,
# sync, variations, QUIC probes), which the closed network refuses. Playwright gives every launch a
# fresh, empty user data dir.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# A page's waits fail after this long instead of Playwright's 30 s: local pages answer in milliseconds.
DEFAULT_TIMEOUT_MS = 10_000


def chromium_path() -> str:
    """The Chromium to drive: $MEMLANE_CHROMIUM, or Debian's /usr/bin/chromium."""
    return os.environ.get("MEMLANE_CHROMIUM") or CHROMIUM


async def launch_chromium(playwright: Playwright, **kwargs) -> Browser:
    """Launch the local Chromium headless with the flags above; extra keyword arguments go to
    `playwright.chromium.launch` (e.g. `slow_mo=`)."""
    exe = chromium_path()
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise FileNotFoundError(
            f"no Chromium at {exe}: install Debian's with `apt-get install -y chromium` "
            "(`make install` does it), or point MEMLANE_CHROMIUM at a Chromium binary"
        )
    return await playwright.chromium.launch(executable_path=exe, headless=True, args=list(CHROMIUM_ARGS), **kwargs)


@pytest.fixture(scope="session")
async def browser():
    """One Chromium for the whole run (launching takes about a second); tests isolate themselves
    with their own context (the `page` fixture does)."""
    async with async_playwright() as pw:
        b = await launch_chromium(pw)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser: Browser):
    """A fresh page in its own browser context (cookies, storage), closed after the test."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    try:
        yield await context.new_page()
    finally:
        await context.close()


@pytest.fixture(scope="session")
def shots_dir(run_id: str) -> Path:
    """This run's screenshot folder, .run/screenshots/<run id>/ (under $MEMLANE_RUN_DIR if set)."""
    base = Path(os.environ.get("MEMLANE_RUN_DIR") or ROOT / ".run") / "screenshots"
    d = base / run_id
    d.mkdir(parents=True, exist_ok=True)
    latest = base / "latest"
    try:
        if latest.is_symlink():
            latest.unlink()
        latest.symlink_to(run_id, target_is_directory=True)
    except OSError:
        pass  # a parallel run got there first, or no symlinks here: the run's own folder is enough
    return d


def console_errors(page: Page) -> list[str]:
    """Collect the page's console errors and uncaught exceptions from now on, into the list returned:
    `assert errors == []` at the end of a test. (A 404 is a console error too, /favicon.ico's included:
    a page without an icon can declare `<link rel="icon" href="data:,">`.)"""
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            where = msg.location
            url = where.get("url") if where else None
            errors.append(f"console.error: {msg.text}" + (f" ({url}:{where.get('lineNumber')})" if url else ""))

    def on_pageerror(exc: Error) -> None:
        errors.append(f"pageerror: {exc.stack or exc.message}" if isinstance(exc, Error) else f"pageerror: {exc}")

    page.on("console", on_console)
    page.on("pageerror", on_pageerror)
    return errors
