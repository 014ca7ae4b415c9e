"""A test stack never starts its API on a port another process serves: that process would
answer the stack's health checks, and its tests would talk to another deployment."""

from __future__ import annotations

import socket

import pytest

from services.stack import Stack


def test_an_api_is_not_started_on_a_port_that_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = Stack({"MEMLANE_API_PORT": str(port)}, tmp_path)
        with pytest.raises(RuntimeError, match=f"port {port} already serves another process"):
            stack.start("api")
        assert stack.procs == {}
