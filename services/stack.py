"""Start and stop memlane's processes as a user would: one per worker, plus the API.

Used by `memlane demo`, the end-to-end tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from settings.environment import child_environment

PIPELINE = ("extraction", "consolidation", "ledger", "embedding", "redis-projection", "history")

# The name of the one process that runs every worker of a stack started `together`.
ALL = "all"


def command(name: str) -> list[str]:
    """How one process of the stack is launched: `api` serves, any other name is a worker
    (`all`: every worker in one process)."""
    args = ["serve"] if name == "api" else ["worker", name]
    return [sys.executable, "-m", "services.cli", *args]


def record_pid(env: dict[str, str], pid: int) -> None:
    """Appends a started process's pid to the file MEMLANE_PID_LOG names, when it names one: the
    test session that set it stops, at its next start, what a killed run left holding its ports
    (`stop_leftovers`)."""
    if path := env.get("MEMLANE_PID_LOG"):
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def stop_leftovers(pid_logs: list[Path], alive: Callable[[int], bool]) -> list[int]:
    """Kills (SIGKILL, with its process group) every memlane process the logs name whose test
    run is gone (`alive` of the pid in the log's name is false), and removes those logs. A pid
    is killed only while it is still a memlane process (a pid can be reused)."""
    killed = []
    for log in pid_logs:
        if alive(int(log.stem)):
            continue
        for line in log.read_text().split():
            pid = int(line)
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # gone already
            if b"services.cli" in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
        log.unlink()
    return killed


def record_start(env: dict[str, str], stack_id: str, name: str) -> None:
    """Appends `<stack> <process>` to the file MEMLANE_START_LOG names, when it names one: a test
    session counts the stacks and processes it started, its children's included. A stack is a
    deployment, known by its topic prefix: a replica or a second worker joining one is a process
    of that stack, not another stack."""
    if path := env.get("MEMLANE_START_LOG"):
        with open(path, "a") as f:
            f.write(f"{env.get('MEMLANE_TOPIC_PREFIX') or stack_id} {name}\n")


@dataclass
class Stack:
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def api_url(self) -> str:
        return self.env.get("MEMLANE_API_URL") or f"http://127.0.0.1:{self.env.get('MEMLANE_API_PORT', '38080')}"

    def start(self, name: str, **env: str) -> subprocess.Popen:
        """`env`: overrides for this process alone (a crash test's MEMLANE_FAULT_AT)."""
        if name == "api":
            self._port_free()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / f"{name}.log", "ab")
        p = subprocess.Popen(
            command(name),
            env={**self.env, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = p
        record_start(self.env, self.id, name)
        record_pid(self.env, p.pid)
        return p

    def start_all(self, workers: tuple[str, ...] = PIPELINE, api: bool = True, timeout: float = 90,
                  together: bool = False, **env: str) -> None:
        """`together`: every worker of the pipeline in one process (`memlane worker all`), for a
        stack whose workers are never killed one at a time; else one process per worker. `env`:
        overrides for these processes alone."""
        if together and workers != PIPELINE:
            raise ValueError("together runs the whole pipeline; name no workers")
        for w in (ALL,) if together else workers:
            self.start(w, **env)
        if api:
            self.start("api", **env)
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see {self.log_dir / (name + '.log')}")
            try:
                r = httpx.get(f"{self.api_url}/health", timeout=2)
                if r.status_code == 200 and r.json()["projection"]["caught_up"]:
                    return r.json()
            except httpx.HTTPError as e:
                last = e
            time.sleep(0.3)
        raise RuntimeError(f"the API did not become healthy in {timeout} s ({last}); see {self.log_dir}/api.log")

    def _port_free(self) -> None:
        """Another deployment's API on our port would answer our health checks (an orphan of
        a killed test run did): refuse to start instead."""
        import socket

        port = int(self.env.get("MEMLANE_API_PORT", "38080"))
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"port {port} already serves another process; stop it or set MEMLANE_API_PORT")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name)
        p.send_signal(sig)
        p.wait(timeout=30)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def free_port() -> int:
    """A loopback port nobody holds right now (for test and benchmark stacks)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_env(**overrides: str) -> dict[str, str]:
    env = child_environment(**overrides)
    env.setdefault("MEMLANE_EMBED_THREADS", "1")
    # Test, demo and bench stacks are development deployments: the default operator key is allowed.
    env.setdefault("MEMLANE_DEV", "1")
    # Many stacks share a test run's machine: no probe servers unless a caller picks their ports.
    if "MEMLANE_METRICS_PORT_BASE" not in env:
        env.setdefault("MEMLANE_METRICS_PORT", "0")
    return env
