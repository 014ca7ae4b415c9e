"""A test stack never starts its API on a port another process serves: that process would
answer the stack's health checks, and its tests would talk to another deployment. A killed test
run's stacks are stopped by the next run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from services.stack import Stack, stop_leftovers


def test_an_api_is_not_started_on_a_port_that_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = Stack({"MEMLANE_API_PORT": str(port)}, tmp_path)
        with pytest.raises(RuntimeError, match=f"port {port} already serves another process"):
            stack.start("api")
        assert stack.procs == {}


def _waiting(*marks: str) -> subprocess.Popen:
    """A process that runs until its stdin closes, its arguments marking what it stands for."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *marks],
                            stdin=subprocess.PIPE, start_new_session=True)


def test_a_killed_runs_leftover_memlane_processes_are_stopped_and_nothing_else(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover, stranger, ours = _waiting("services.cli"), _waiting("not-memlane"), _waiting("services.cli")
    try:
        gone_run = tmp_path / f"{dead.pid}.log"
        gone_run.write_text(f"{leftover.pid}\n{stranger.pid}\n")
        live_run = tmp_path / f"{os.getpid()}.log"
        live_run.write_text(f"{ours.pid}\n")
        assert stop_leftovers([gone_run, live_run], lambda pid: pid == os.getpid()) == [leftover.pid]
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None and ours.poll() is None  # not memlane's; a live run's
        assert not gone_run.exists() and live_run.exists()
    finally:
        for p in (leftover, stranger, ours):
            p.kill()
            p.wait()
