"""The browser test infrastructure works: Debian's Chromium opens a local page, runs its script, is
clicked by role and name, and leaves a screenshot behind. No Kafka or Redis needed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from playwright.async_api import expect

from tests.e2e.browser_support import browser, console_errors, page, shots_dir  # noqa: F401

PAGE = b"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>memlane browser smoke</title><link rel="icon" href="data:,"></head>
<body>
  <p id="status" role="status">Waiting</p>
  <button type="button" onclick="document.getElementById('status').textContent = 'Clicked'">Press me</button>
</body>
</html>
"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format, *args) -> None:  # quiet
        pass


@contextmanager
def serving() -> Iterator[str]:
    """The page above on a free port of 127.0.0.1, served from a thread; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


async def test_click_changes_text_and_screenshot(page, shots_dir):  # noqa: F811 (fixtures imported above)
    errors = console_errors(page)
    with serving() as url:
        await page.goto(url)
        status = page.get_by_role("status")
        await expect(status).to_have_text("Waiting")
        await page.get_by_role("button", name="Press me").click()
        await expect(status).to_have_text("Clicked")
        shot = shots_dir / "browser_smoke.png"
        await page.screenshot(path=shot)
    assert shot.is_file() and shot.stat().st_size > 0, shot
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
    assert errors == []
