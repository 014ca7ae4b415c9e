"""The OpenAPI document is part of the public contract: a restructuring must leave it byte
for byte as it was. A change made on purpose regenerates the snapshot:
`python -m tests.unit.test_openapi_document`."""

from __future__ import annotations

import json
from pathlib import Path

from services.http import build_app
from services.web.pages import WebExtension
from settings import Settings

SNAPSHOT = Path(__file__).with_name("openapi.json")


def document() -> str:
    """The document as `memlane serve` publishes it (the web page included), in a stable form."""
    app = build_app(Settings(), extra=[WebExtension()])
    return json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"


def test_the_openapi_document_is_unchanged():
    assert document() == SNAPSHOT.read_text(), "the API changed: if on purpose, regenerate the snapshot (module docstring)"


if __name__ == "__main__":
    SNAPSHOT.write_text(document())
