"""`memlane start`: every worker and the API as supervised child processes on one machine.

Each child is launched as `services/stack.py` launches it (`python -m services.cli worker
NAME` or `serve`), in a session of its own, with its output in `<log dir>/<child>.log`. A child
that exits is started again after a delay that doubles with each quick exit, up to a cap, and
starts over once the child stayed up for a while (`Backoff`, a pure rule). SIGTERM or SIGINT
stops the run: SIGTERM to every child, a bounded wait, SIGKILL to the stragglers, exit 0.

Readiness is the whole run's: every child running and the API's `/health` answering 200 with
its projection caught up and every supervised worker's heartbeat alive. The supervisor prints
a `ready` line when that first holds (and again after it was lost), and keeps a status file
(JSON: each child's pid, state, restarts and log) that tools and tests read.
See docs/operations/supervisor.md.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.supervisor_plan import API, Backoff, instance_base, instances, parse_replicas, plan, probe_ports
from settings.environment import child_environment

if TYPE_CHECKING:
    from settings import Settings

TICK_S = 0.2
# A child without a /ready of its own counts as up once it has run this long: one that
# crashes at start is then never reported ready in between its restarts.
UP_AFTER_S = 2.0
HEALTH_EVERY_S = 1.0


def readiness(children: list[Child], health: dict[str, Any] | None, status_code: int | None,
              now: float) -> list[str]:
    """What keeps the run from being ready (empty: ready). `health`: the API's /health body
    (None: no answer); without an API child, only the children's own state counts.

    A child with a probe port must also answer 200 on its own `/ready` (workers.runtime.probe,
    services.http.readiness)."""
    waiting = [f"{c.name}: {c.state}" for c in children if c.state != "running"]
    for c in children:
        if c.state != "running":
            continue
        if c.probe_port is None:
            if now - c.started < UP_AFTER_S:
                waiting.append(f"{c.name}: starting")
        elif c.probe is None:
            waiting.append(f"{c.name}: no answer on /ready (port {c.probe_port}) yet")
        elif c.probe[0] != 200:
            waiting.append(f"{c.name}: not ready ({'; '.join(c.probe[1][:2]) or f'HTTP {c.probe[0]}'})")
    if not any(c.kind == API for c in children):
        return waiting
    if health is None:
        return [*waiting, "api: /health does not answer yet"]
    if status_code != 200:
        waiting += [f"/health: {p}" for p in health.get("problems", [])] or [f"/health: HTTP {status_code}"]
    if not health.get("projection", {}).get("caught_up", False):
        waiting.append("api: memory projection catching up")
    beats = health.get("workers", {})
    for kind in sorted({c.kind for c in children if c.kind != API}):
        if not beats.get(kind, {}).get("alive"):
            waiting.append(f"{kind}: no heartbeat yet")
    return waiting


def env_of(env: dict[str, str], c: Child) -> dict[str, str]:
    """The environment `c` starts with: the run's, and its own probe port and instance."""
    own = {"MEMLANE_METRICS_PORT": None if c.probe_port is None else str(c.probe_port),
           "MEMLANE_WORKER_INSTANCE": c.instance}
    return {**env, **{k: v for k, v in own.items() if v is not None}}


def _now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def say(line: str) -> None:
    """Progress for the operator: one line each, names, pids and exit codes, never data."""
    print(f"{_now()} memlane start: {line}", flush=True)


def _die_with_parent() -> None:
    """In the child before exec: on Linux, SIGTERM this child if the supervisor dies (even by
    kill -9), so no worker outlives it unsupervised."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass
class Child:
    name: str
    kind: str
    log: Path
    proc: subprocess.Popen | None = None
    state: str = "starting"  # starting | running | backoff | stopped
    started: float = 0.0
    failures: int = 0
    restarts: int = 0
    restart_at: float = 0.0
    last_exit: str | None = None
    # Its own /ready (workers.runtime.probe) on this port, set in its environment; None: not probed.
    probe_port: int | None = None
    probe: tuple[int, list[str]] | None = None  # the last answer: (HTTP status, reasons)
    # Its MEMLANE_WORKER_INSTANCE, the same at each start (`instances`); None: not a worker.
    instance: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def view(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "uptime_s": round(now - self.started, 1) if self.state == "running" else None,
            "next_start_in_s": round(max(0.0, self.restart_at - now), 1) if self.state == "backoff" else None,
            "last_exit": self.last_exit,
            "ready_port": self.probe_port,
            "ready": None if self.probe is None else self.probe[0] == 200,
            "instance": self.instance,
            "log": str(self.log),
        }


def _count(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


@dataclass
class Supervisor:
    children: list[Child]
    env: dict[str, str]
    api_url: str
    status_file: Path
    backoff: Backoff = field(default_factory=Backoff)
    stop_timeout_s: float = 20.0
    probe_host: str = "127.0.0.1"
    stopping: bool = False
    killing: bool = False
    ready: bool = False
    health: dict[str, Any] | None = None
    health_code: int | None = None
    waiting: list[str] = field(default_factory=list)
    _health_at: float = 0.0

    # ---- children

    def spawn(self, c: Child) -> None:
        from services.stack import command, record_start

        c.log.parent.mkdir(parents=True, exist_ok=True)
        with open(c.log, "ab") as out:
            out.write(f"\n--- {datetime.now(UTC).isoformat(timespec='seconds')} memlane start: "
                      f"starting {c.name} (start {c.restarts + 1}) ---\n".encode())
            out.flush()
            try:
                c.proc = subprocess.Popen(command(c.kind), env=env_of(self.env, c), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)
                record_start(self.env, f"supervisor-{os.getpid()}", c.name)
            except OSError as e:
                say(f"cannot start {c.name}: {type(e).__name__}")
                c.proc, c.started = None, time.monotonic()
                self._exited(c, f"not started ({type(e).__name__})")
                return
        c.state, c.started, c.probe = "running", time.monotonic(), None
        say(f"started {c.name} (pid {c.proc.pid}), log {c.log}")

    def _exited(self, c: Child, how: str) -> None:
        now = time.monotonic()
        uptime = now - c.started
        c.last_exit = how
        if self.stopping:
            c.state = "stopped"
            return
        c.failures, wait = self.backoff.after_exit(c.failures, uptime)
        c.state, c.restart_at = "backoff", now + wait
        say(f"{c.name} exited ({how}) after {uptime:.1f} s; restarting in {wait:.1f} s "
            f"(quick exits in a row: {c.failures}), see {c.log}")

    def check_children(self) -> None:
        now = time.monotonic()
        for c in self.children:
            if c.state == "running" and c.proc is not None and (code := c.proc.poll()) is not None:
                self._exited(c, _exit_text(code))
            elif c.state == "backoff" and now >= c.restart_at and not self.stopping:
                c.restarts += 1
                self.spawn(c)

    # ---- readiness

    def check_health(self) -> None:
        now = time.monotonic()
        if now - self._health_at < HEALTH_EVERY_S:
            return
        self._health_at = now
        import httpx

        for c in self.children:
            if c.state == "running" and c.probe_port is not None:
                c.probe = self._ready(httpx, c)
        if not any(c.kind == API for c in self.children):
            return
        try:
            r = httpx.get(f"{self.api_url}/health", timeout=1.5)
            self.health, self.health_code = r.json(), r.status_code
        except (httpx.HTTPError, ValueError):
            self.health, self.health_code = None, None

    def _ready(self, httpx: Any, c: Child) -> tuple[int, list[str]] | None:
        """The child's own /ready answer; None when nothing answers, or when what answers on
        its port is another process (a port this child could not take)."""
        try:
            r = httpx.get(f"http://{self.probe_host}:{c.probe_port}/ready", timeout=0.5)
            body = r.json()
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(body, dict) or body.get("process") != c.kind:
            return None
        return r.status_code, [str(x) for x in body.get("reasons", [])]

    def update_readiness(self) -> None:
        self.waiting = readiness(self.children, self.health, self.health_code, time.monotonic())
        if not self.waiting and not self.ready:
            self.ready = True
            api = f", API {self.api_url} healthy" if any(c.kind == API for c in self.children) else ""
            say(f"ready: {_count(len(self.children))} up{api}; status in {self.status_file}")
        elif self.waiting and self.ready:
            self.ready = False
            say(f"not ready: {'; '.join(self.waiting[:4])}")

    def write_status(self, phase: str) -> None:
        now = time.monotonic()
        body = {
            "supervisor_pid": os.getpid(),
            "phase": phase,
            "ready": self.ready,
            "waiting": self.waiting,
            "api_url": self.api_url,
            "api_health": None if self.health is None else {
                "status": self.health.get("status"), "problems": self.health.get("problems", [])},
            "children": [c.view(now) for c in self.children],
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        tmp = self.status_file.with_name(self.status_file.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2))
        os.replace(tmp, self.status_file)

    # ---- the run

    def on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            self.killing = True  # a second signal: no more waiting
        self.stopping = True

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        say(f"supervising {_count(len(self.children))} (pid {os.getpid()}); SIGTERM or Ctrl-C stops them")
        try:
            for c in self.children:
                if self.stopping:
                    break
                self.spawn(c)
            while not self.stopping:
                # Probes first: a child that died meanwhile is then reported as exited before
                # the run is reported not ready.
                self.check_health()
                self.check_children()
                self.update_readiness()
                self.write_status("running")
                time.sleep(TICK_S)
        finally:
            self.stop()
        return 0

    def stop(self) -> None:
        self.stopping = True
        self.ready = False
        live = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        say(f"stopping {_count(len(live))} (SIGTERM, then SIGKILL after {self.stop_timeout_s:g} s)")
        self.write_status("stopping")
        for c in live:
            self._signal(c, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while (any(c.proc.poll() is None for c in live if c.proc is not None) and time.monotonic() < deadline
               and not self.killing):
            time.sleep(0.1)
        for c in live:
            assert c.proc is not None  # every live child has a process
            if c.proc.poll() is None:
                say(f"{c.name} (pid {c.proc.pid}) did not stop in time: SIGKILL")
                self._signal(c, signal.SIGKILL)
            c.proc.wait()
            c.state, c.last_exit = "stopped", _exit_text(c.proc.returncode)
        for c in self.children:
            c.state = "stopped"
        self.write_status("stopped")
        say("stopped every process")

    @staticmethod
    def _signal(c: Child, sig: int) -> None:
        """To the child's process group (its session), so anything it forked stops too."""
        assert c.proc is not None  # only live children are signalled
        try:
            os.killpg(c.proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            c.proc.send_signal(sig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default=None,
                   help="comma-separated processes to run, among extraction, consolidation, ledger, embedding, "
                   "redis-projection, history and api (default: all of them)")
    p.add_argument("--replicas", action="append", default=[], metavar="NAME=N",
                   help="run N processes of a worker in its consumer group (repeatable), e.g. --replicas ledger=2")
    p.add_argument("--log-dir", default=None, help="one log file per process here (default: <data dir>/logs)")
    p.add_argument("--status-file", default=None,
                   help="JSON status written while running (default: <data dir>/supervisor.json)")
    p.add_argument("--stop-timeout", type=seconds("--stop-timeout"), default=20.0,
                   help="seconds between SIGTERM and SIGKILL at stop (default 20)")
    p.add_argument("--backoff-base", type=seconds("--backoff-base"), default=Backoff.base_s, help="first restart delay, seconds")
    p.add_argument("--backoff-cap", type=seconds("--backoff-cap"), default=Backoff.cap_s, help="longest restart delay, seconds")
    p.add_argument("--backoff-reset", type=seconds("--backoff-reset"), default=Backoff.reset_after_s,
                   help="a child up this long counts as healthy again, seconds")


def seconds(flag: str) -> Callable[[str], float]:
    """An argparse type: a number of seconds above 0 (0 or less would restart a crashing child
    in a tight loop, or kill every child at once)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{flag}: a number of seconds above 0, got {text!r}")
        return value

    return parse


def child_env() -> dict[str, str]:
    """This process's environment, with the checkout importable (like stack_env, but no
    development defaults: `memlane start` is how a machine runs memlane)."""
    return child_environment()


def run_from_args(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.metrics import PORT_INDEX

    try:
        workers = [w.strip() for w in args.workers.split(",") if w.strip()] if args.workers else None
        children = plan(workers, parse_replicas(args.replicas))
    except ValueError as e:
        print(f"memlane start: {e}", file=sys.stderr)
        return 2
    data_dir = settings.data_dir
    # MEMLANE_METRICS_PORT=0 turns every process's probe server off; any other value would
    # give every child one port, so each gets its own instead.
    ports = probe_ports(children, None if settings.metrics_port == 0 else settings.metrics_port_base, PORT_INDEX)
    log_dir = Path(args.log_dir) if args.log_dir else data_dir / "logs"
    status_file = Path(args.status_file) if args.status_file else data_dir / "supervisor.json"
    status_file.parent.mkdir(parents=True, exist_ok=True)
    # One supervisor per data dir: a second would start a second API on the same Qdrant shards.
    lock = open(status_file.with_name(status_file.name + ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"memlane start: another supervisor holds {lock.name}", file=sys.stderr)
        return 2
    ids = instances(children, instance_base(settings.worker_instance, socket.gethostname(), Path(lock.name)))
    sup = Supervisor(
        children=[Child(name, kind, log_dir / f"{name}.log", probe_port=ports.get(name), instance=ids.get(name))
                  for name, kind in children],
        env=child_env(),
        api_url=settings.api_url,
        probe_host=settings.metrics_host,
        status_file=status_file,
        backoff=Backoff(args.backoff_base, args.backoff_cap, args.backoff_reset),
        stop_timeout_s=args.stop_timeout,
    )
    try:
        return sup.run()
    finally:
        lock.close()
