"""Shared fixtures. Integration tests use the Kafka and Redis that `make up` started,
or, with MEMLANE_TEST_INFRA=containers, testcontainers (for people with Docker)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from services.stack import stop_leftovers
from settings import Settings
from tests import scheduling
from workers.runtime.processes import running

ROOT = Path(__file__).resolve().parent.parent


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def infra():
    """Environment overrides that point memlane at a real Kafka and Redis."""
    if os.environ.get("MEMLANE_TEST_INFRA") == "containers":
        from testcontainers.kafka import KafkaContainer
        from testcontainers.redis import RedisContainer

        kafka = KafkaContainer("apache/kafka:4.1.1").with_kraft()
        redis = RedisContainer("redis:7")
        kafka.start()
        redis.start()
        env = {
            "MEMLANE_KAFKA_BOOTSTRAP": kafka.get_bootstrap_server(),
            "REDIS_URL": f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0",
        }
        yield env
        kafka.stop()
        redis.stop()
        return
    s = Settings()
    host, port = s.kafka_bootstrap.split(":")
    if not _reachable(host, int(port)):
        pytest.fail(f"Kafka is not reachable at {s.kafka_bootstrap}: run `make up` first (or `make test`)")
    from tests import redis_cluster

    # MEMLANE_TEST_REDIS=cluster: every Redis client of the session and its stacks on a Redis Cluster.
    yield redis_cluster.cluster_env() if redis_cluster.selected() else {}


@pytest.fixture(scope="session")
def run_id() -> str:
    return f"t{int(time.time())}{uuid.uuid4().hex[:4]}"


@pytest.fixture(scope="session")
def settings(infra, run_id, tmp_path_factory):
    """Every test's topics start with this run's prefix, and are deleted when the run ends:
    kept, a dev broker gathered thousands of partitions over repeated runs."""
    for k, v in infra.items():
        os.environ[k] = v
    s = Settings(
        topic_prefix=f"{run_id}.",
        data_dir=tmp_path_factory.mktemp("data"),
        api_port=int(os.environ.get("MEMLANE_TEST_API_PORT", "28181")),
    )
    yield s
    from concurrent.futures import ThreadPoolExecutor

    from workers.runtime.kafka_io import delete_prefixed_topics

    with ThreadPoolExecutor(1) as pool:  # its own loop, whatever loop this thread has
        pool.submit(asyncio.run, delete_prefixed_topics(s, run_id)).result()


async def eventually(check, timeout: float = 30.0, interval: float = 0.1):
    """Poll `check` until it returns a truthy value; fail with its last result otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await check() if asyncio.iscoroutinefunction(check) else check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s; last result: {last!r}")


async def refused(coro, status: int, code: str, field: str | None = None):
    """Awaits `coro`, which must fail with this HTTP status, error code and (when given) field."""
    from services.client import MemlaneError

    with pytest.raises(MemlaneError) as e:
        await coro
    assert (e.value.status, e.value.code) == (status, code), e.value
    if field is not None:
        assert e.value.field == field, e.value
    return e.value


# ---------------------------------------------------------------------------------- tiers

# Cheapest first: a broken unit test is reported in seconds, and a failing tier stops the ones after it.
TIERS = ("unit", "contract", "integration", "e2e", "resilience")


def tier_of(node: pytest.Item | pytest.TestReport) -> int:
    parts = node.nodeid.split("/")  # tests/<tier>/...
    return TIERS.index(parts[1]) if len(parts) > 2 and parts[1] in TIERS else len(TIERS)


def _order(item: pytest.Item) -> tuple[int, int]:
    """Tiers, cheapest first; within one, the bare deployment's modules first, in BARE_ORDER:
    its group (one process, a test at a time, about two minutes) is then handed out as soon as
    its first tier starts, not after every other module of that tier."""
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return tier_of(item), BARE_ORDER.index(module) - len(BARE_ORDER) if module in BARE_ORDER else 0


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_order)  # stable: each tier keeps its modules' order
    if hasattr(config, "workerinput"):
        scheduling.write_groups(Path(os.environ["MEMLANE_TEST_GROUPS"]), items)


@pytest.hookimpl(tryfirst=True)  # before xdist's own schedulers
def pytest_xdist_make_scheduler(config, log):
    return scheduling.GroupScheduling(config, log)


def _failed_tiers() -> set[int]:
    path = Path(os.environ["MEMLANE_FAILED_TIERS"])
    return {int(t) for t in path.read_text().split()} if path.exists() else set()


def pytest_runtest_logreport(report):
    """A failure's tier goes to a file every worker reads, so a failing tier stops later tiers
    in all of them, not only in the worker it failed in."""
    if report.failed:
        with open(os.environ["MEMLANE_FAILED_TIERS"], "a") as f:
            f.write(f"{tier_of(report)}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    failed = _failed_tiers()
    if nextitem is not None and failed and tier_of(nextitem) > min(failed):
        name = TIERS[min(failed)] if min(failed) < len(TIERS) else "other"
        item.session.shouldstop = f"the {name} tier failed: the tiers after it are not run"


def pytest_configure(config):
    """Every stack this session starts, its children's too, writes a line per process to one
    file (services.stack.record_start); the session prints the count at its end. xdist's
    workers inherit the controller's files."""
    if hasattr(config, "workerinput"):
        return
    run = ROOT / ".run"
    run.mkdir(exist_ok=True)
    # A run killed before its fixtures stopped its stacks left them holding their ports.
    pids = run / "pids"
    pids.mkdir(exist_ok=True)
    if left := stop_leftovers(sorted(pids.glob("*.log")), running):
        print(f"memlane: stopped {len(left)} processes an earlier, killed test run left running")
    os.environ["MEMLANE_PID_LOG"] = str(pids / f"{os.getpid()}.log")
    path, failed = run / f"starts-{os.getpid()}.log", run / f"failed-tiers-{os.getpid()}"
    path.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    os.environ["MEMLANE_START_LOG"] = str(path)
    os.environ["MEMLANE_FAILED_TIERS"] = str(failed)
    os.environ["MEMLANE_TEST_GROUPS"] = str(run / f"groups-{os.getpid()}.json")
    config._memlane_starts = path




def pytest_unconfigure(config):
    """What the session's fixtures did not stop (a process a test started again and left) goes now."""
    if not hasattr(config, "workerinput") and (log := os.environ.get("MEMLANE_PID_LOG")) and Path(log).exists():
        stop_leftovers([Path(log)], lambda _: False)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = getattr(config, "_memlane_starts", None)
    lines = path.read_text().split() if path and path.exists() else []
    stacks, processes = set(lines[0::2]), len(lines) // 2
    kinds = sorted(set(lines[1::2]))
    terminalreporter.write_line(f"memlane: {len(stacks)} stacks, {processes} processes started ({', '.join(kinds)})")


# ---------------------------------------------------------------------------------- failure reports


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a stack gets its processes' warnings and batch summaries
    written during the test: a failure in CI is read from the report alone."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    since = call.start
    try:
        base = item.config._tmp_path_factory.getbasetemp()
    except Exception:
        return
    # A test's own stack logs under `<test>/logs`, the session's stack under `logs<N>`.
    for log in sorted([*base.glob("*/logs/*.log"), *base.glob("logs*/*.log")]):
        if log.parent.is_symlink() or log.parent.parent.is_symlink() or log.stat().st_mtime < since:
            continue  # pytest's `<name>current` links repeat a numbered directory
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if _written_since(ln, since)]
        notable = [ln for ln in lines if '"level": "warning"' in ln or '"level": "error"' in ln
                   or "turns_forwarded" in ln or "Traceback" in ln or "Error" in ln]
        tail = [ln[:600] for ln in (notable or lines)[-40:]]
        if tail:
            report.sections.append((f"stack log {log.parent.parent.name}/{log.parent.name}/{log.name}", "\n".join(tail)))


def _written_since(line: str, since: float) -> bool:
    """A structured line stamped before `since` is left out; any other line (a traceback's) is kept."""
    m = re.search(r'"timestamp": "([^"]+)"', line)
    if m is None:
        return True
    try:
        return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp() >= since
    except ValueError:
        return True


# The shared stacks' fixtures, registered here so each starts once a session whatever tiers run
# (imported last: the stacks' support modules import this module's helpers).
from tests.stacks import (BARE_ORDER, bare_deployment, bare_stack, fake, jobs_stack, model_stack, otlp,  # noqa: E402, F401, I001
                          new_agent, operator, publisher, stack)
