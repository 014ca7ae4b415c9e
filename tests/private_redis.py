"""A redis-server of a test's own, for tests that stop or break it."""

from __future__ import annotations

import subprocess
import time

from services.stack import free_port

FIRST_START_TRIES = 5


class PrivateRedis:
    """A real redis-server of this test's own, so stopping it disturbs nothing else.

    A port free when picked can be taken before the server binds it (another test process's
    server, or a client's ephemeral port), and a daemonized server that cannot bind exits
    without a word: a test then talked to another test's Redis, which that test flushed or
    stopped. So `start` waits for the pidfile, which the server writes only once it listens,
    and a first start that does not get its port tries another one."""

    def __init__(self, tmp_path) -> None:
        self.dir = tmp_path / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Again after `stop`, on the same port: the test's clients know only that one."""
        for _ in range(1 if self.started else FIRST_START_TRIES):
            if self._start_on(self.port):
                self.started = True
                return
            if not self.started:
                self.port = free_port()
        raise RuntimeError(f"redis-server could not listen on port {self.port}; see {self.dir / 'log'}")

    def _start_on(self, port: int) -> bool:
        pidfile, log = self.dir / "pid", self.dir / "log"
        pidfile.unlink(missing_ok=True)
        seen = log.stat().st_size if log.exists() else 0
        subprocess.run(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "yes",
             "--pidfile", str(pidfile), "--logfile", str(log)],
            check=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if pidfile.exists():
                return True
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(seen)
                    if b"aborting" in f.read():  # "Failed listening on port ..., aborting."
                        return False
            time.sleep(0.02)
        return False

    def ping(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == b"PONG"

    def stop(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown"], capture_output=True)
