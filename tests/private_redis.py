"""A redis-server of a test's own, for tests that stop or break it."""

from __future__ import annotations

import subprocess
import threading

from services.stack import free_port

FIRST_START_TRIES = 5
READY = b"Ready to accept connections"


class PrivateRedis:
    """A real redis-server of this test's own, so stopping it disturbs nothing else.

    A port free when picked can be taken before the server binds it (another test process's
    server, or a client's ephemeral port): a test then talked to another test's Redis, which
    that test flushed or stopped. So `start` reads the server's log until it says it is ready
    (or the server exits: it could not listen), and a first start that does not get its port
    tries another one."""

    def __init__(self, tmp_path) -> None:
        self.dir = tmp_path / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.started = False
        self.proc: subprocess.Popen | None = None

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
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--logfile", ""],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert proc.stdout is not None
        log = open(self.dir / "log", "ab")
        for line in proc.stdout:  # until ready, or the end of a server that could not listen
            log.write(line)
            if READY in line:
                # The rest of its log goes on to the file, so the pipe never fills.
                threading.Thread(target=_copy, args=(proc.stdout, log), daemon=True).start()
                self.proc = proc
                return True
        log.close()
        proc.wait()
        return False

    def ping(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == b"PONG"

    def stop(self) -> None:
        if self.proc is not None:
            subprocess.run(["redis-cli", "-p", str(self.port), "shutdown"], capture_output=True)
            self.proc.wait()
            self.proc = None


def _copy(src, log) -> None:
    with log:
        for line in src:
            log.write(line)
            log.flush()
