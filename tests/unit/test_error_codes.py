"""Error codes: one enum, written on the wire as the same strings as before it existed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from events.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]


def test_each_code_is_its_own_name_on_the_wire_and_in_text():
    for code in ErrorCode:
        assert code.value == code.name
        # The forms a code reaches a client or a log line in: JSON, str(), f-strings.
        assert (json.dumps(code), str(code), f"{code}", f"{code:>1}") == (f'"{code.name}"', *[code.name] * 3)
        assert code == code.name and {code.name: 1}[code] == 1  # a code read back as plain text matches


def test_no_module_spells_an_error_code_as_a_bare_string():
    """Codes are written as `ErrorCode` members, so a code is spelled in one place only."""
    codes = {c.value for c in ErrorCode}
    found = []
    for package in ("events", "projections", "services", "settings", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "events" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in codes:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert found == []
