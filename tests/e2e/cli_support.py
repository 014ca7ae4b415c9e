"""What the end-to-end tests of `memlane` commands share: running one as an operator does, and an
agent whose memory is its own (agent scope) with pins."""

from __future__ import annotations

import subprocess
import sys

from events import AgentConfig
from tests.conftest import ROOT

AGENT_MEMORY = AgentConfig.model_validate({"memory": {
    "scope": {"read": ["agent"], "write": ["agent"]}, "pinned": {"max_tokens": 200},
    "tools": ["add_memory", "read_memory", "delete_memory", "pin_memory", "unpin_memory"]}})


def memlane(stack, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """`memlane ARGS` as a subprocess with the stack's environment, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "services.cli", *args], env={**stack.env, "COLUMNS": "250"},
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
