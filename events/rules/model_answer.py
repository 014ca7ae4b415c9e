"""A model's JSON answer: the error a malformed one raises, and the first parse every answer takes."""

from __future__ import annotations

import json
from typing import Any


class Malformed(ValueError):
    """The model's answer does not parse or does not match the schema."""


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise Malformed(f"not JSON: {e.msg} at position {e.pos}") from None
    if not isinstance(data, dict):
        raise Malformed(f"expected a JSON object, got {type(data).__name__}")
    return data
