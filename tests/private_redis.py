"""A redis-server of a test's own, for tests that stop or break it."""

from __future__ import annotations

import subprocess

from services.stack import free_port


class PrivateRedis:
    """A real redis-server of this test's own, so stopping it disturbs nothing else."""

    def __init__(self, tmp_path) -> None:
        self.port, self.dir = free_port(), tmp_path / "redis"
        self.dir.mkdir()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "yes",
             "--pidfile", str(self.dir / "pid"), "--logfile", str(self.dir / "log")],
            check=True,
        )

    def ping(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == b"PONG"

    def stop(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown"], capture_output=True)
