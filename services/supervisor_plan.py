"""What `memlane start` runs, worked out before anything starts: the children (a process per
worker kind, or several of one kind), their probe ports and worker instances, and how long a
child that keeps exiting waits before it is started again."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

API = "api"


@dataclass(frozen=True)
class Backoff:
    """How long to wait before starting a child again: `base_s` after its first quick exit,
    doubling with each further one up to `cap_s`. A child that stayed up `reset_after_s` or
    longer before exiting counts as healthy again, so its next restart waits `base_s`."""

    base_s: float = 1.0
    cap_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th consecutive quick exit (1, 2, ...)."""
        if failures < 1:
            return 0.0
        return min(self.cap_s, self.base_s * 2.0 ** min(failures - 1, 62))

    def after_exit(self, failures: int, uptime_s: float) -> tuple[int, float]:
        """(consecutive failures now, seconds to wait) for a child that exited after
        `uptime_s` seconds, having had `failures` consecutive quick exits before this run."""
        failures = 1 if uptime_s >= self.reset_after_s else failures + 1
        return failures, self.delay(failures)


def known_kinds() -> tuple[str, ...]:
    # Imported here: the CLI builds `start`'s arguments on every command, and services.stack
    # brings httpx along.
    from services.stack import PIPELINE

    return (*PIPELINE, API)


def plan(workers: list[str] | None, replicas: dict[str, int]) -> list[tuple[str, str]]:
    """(child name, kind) for each process to run: one per worker kind, or `kind.1` ...
    `kind.N` for a kind run N times (each its own process in the kind's consumer group)."""
    known = known_kinds()
    kinds = list(known) if not workers else workers
    unknown = [k for k in [*kinds, *replicas] if k not in known]
    if unknown:
        raise ValueError(f"unknown worker {unknown[0]!r}; choose among {', '.join(known)}")
    missing = [k for k in replicas if k not in kinds]
    if missing:
        raise ValueError(f"--replicas names {missing[0]!r}, which --workers leaves out")
    if replicas.get(API, 1) != 1:
        raise ValueError("the API runs once per machine (it owns its port and its Qdrant shards)")
    out: list[tuple[str, str]] = []
    for kind in dict.fromkeys(kinds):
        n = replicas.get(kind, 1)
        out += [(kind, kind)] if n == 1 else [(f"{kind}.{i}", kind) for i in range(1, n + 1)]
    return out


def probe_ports(children: list[tuple[str, str]], base: int | None, index: dict[str, int]) -> dict[str, int]:
    """Each child's /metrics and /ready port (child name -> port), handed to it as
    MEMLANE_METRICS_PORT: a kind's first process gets its usual port (`base` + its index, as
    docs/reference/metrics.md lists them), further replicas `base` + 20, 21, ... None base: no probes."""
    if base is None:
        return {}
    ports: dict[str, int] = {}
    seen: set[str] = set()
    extra = 20
    for name, kind in children:
        if kind not in seen and kind in index:
            ports[name] = base + index[kind]
        else:
            ports[name], extra = base + extra, extra + 1
        seen.add(kind)
    return ports


def instances(children: list[tuple[str, str]], base: str) -> dict[str, str]:
    """Each worker child's MEMLANE_WORKER_INSTANCE (child name -> instance): `base`, which names
    this supervisor, and the child's number among its kind's processes (1, 2, ...). A restarted
    child keeps its instance, so its transactional producers fence the ones it left behind; no
    two live children share one. The API runs no transactional worker: it gets none."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for name, kind in children:
        if kind != API:
            seen[kind] = seen.get(kind, 0) + 1
            out[name] = f"{base}.{seen[kind]}"
    return out


def instance_base(configured: str, host: str, lock: Path) -> str:
    """What names this supervisor among every process of the deployment: MEMLANE_WORKER_INSTANCE
    when set (one per machine), else the host and a digest of the lock file it holds, so two
    supervisors of one deployment never give two children the same instance."""
    if configured:
        return configured
    return f"{host}-{hashlib.sha256(str(lock.resolve()).encode()).hexdigest()[:6]}"


def parse_replicas(specs: list[str]) -> dict[str, int]:
    """['ledger=2', 'embedding=3'] -> {'ledger': 2, 'embedding': 3}."""
    out: dict[str, int] = {}
    for spec in specs:
        name, _, n = spec.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--replicas takes name=N with N >= 1, not {spec!r}")
        out[name.strip()] = int(n)
    return out
