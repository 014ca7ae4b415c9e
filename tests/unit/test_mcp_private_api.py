"""The MCP SDK internals memlane relies on, checked so an SDK upgrade that drops them fails
here and not in an agent's session (pyproject pins mcp to 2.x for the same reason)."""

from __future__ import annotations

import inspect
from importlib.metadata import version

from mcp.server.mcpserver import MCPServer


def test_the_sdk_is_the_pinned_major_version():
    major, minor = (int(p) for p in version("mcp").split(".")[:2])
    assert major == 2 and minor >= 3


def test_mcpserver_still_exposes_its_low_level_server():
    # services/mcp_server.run_stdio serves its own screened stdin through it.
    low = MCPServer("probe")._lowlevel_server
    assert inspect.iscoroutinefunction(low.run)
    assert list(inspect.signature(low.run).parameters)[:2] == ["read_stream", "write_stream"]
    low.create_initialization_options()
