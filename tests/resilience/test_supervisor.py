"""`memlane start` as an operator runs it: every process up and reported ready, a child killed
with SIGKILL started again (the stack then answers writes and searches), and SIGTERM stops
every child cleanly with exit code 0."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from events import AgentConfig
from services.client import MemlaneClient
from tests.conftest import eventually

VICTIM = "ledger"  # a write needs it: the stack answering a write proves it came back


def _free_range(n: int) -> int:
    """The first of `n` consecutive loopback ports nobody holds now: each child's /ready port."""
    for _ in range(50):
        base = random.randrange(20_000, 30_000)
        try:
            socks = []
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# On the bare deployment (tests/stacks.py), after its other modules: `memlane start` runs every
# process of it, each with a /ready port (the deployment's own processes have none).
async def test_start_restarts_a_killed_child_and_stops_cleanly(bare_stack, tmp_path):
    settings = bare_stack.settings
    api_port = settings.api_port
    env = {k: v for k, v in bare_stack.stack.env.items() if k != "MEMLANE_METRICS_PORT"}
    env["MEMLANE_METRICS_PORT_BASE"] = str(_free_range(25))
    memlane = Path(sys.executable).with_name("memlane")
    out_path, logs = tmp_path / "start.out", tmp_path / "logs"
    status_file = settings.data_dir / "supervisor.json"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([str(memlane), "start", "--log-dir", str(logs), "--stop-timeout", "30"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    seen_pids: set[int] = set()

    def output() -> str:
        return out_path.read_text(errors="replace")

    def status() -> dict:
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):  # not written yet
            return {}

    def children() -> dict[str, dict]:
        return {c["name"]: c for c in status().get("children", [])}

    try:
        async def ready():
            assert proc.poll() is None, f"memlane start exited with {proc.returncode}:\n{output()[-3000:]}"
            return "memlane start: ready:" in output() and status().get("ready")

        await eventually(ready, timeout=180, interval=0.5)
        first = children()
        assert set(first) == {"extraction", "consolidation", "ledger", "embedding", "redis-projection", "history", "api"}
        assert all(c["state"] == "running" and c["pid"] and c["ready"] for c in first.values()), first
        assert all((logs / f"{name}.log").stat().st_size > 0 for name in first)
        seen_pids |= {c["pid"] for c in first.values()}

        victim = first[VICTIM]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted():
            c = children().get(VICTIM, {})
            return (c.get("restarts") == 1 and c.get("pid") not in (None, victim) and status().get("ready")
                    and not _alive(victim) and c)

        again = await eventually(restarted, timeout=120, interval=0.5)
        seen_pids.add(again["pid"])
        assert f"{VICTIM} exited (signal SIGKILL)" in output()
        assert all(c["pid"] == first[n]["pid"] for n, c in children().items() if n != VICTIM)  # only it restarted
        # It came back as the same instance: its transactional producer fenced the one it left behind.
        assert again["instance"] == first[VICTIM]["instance"] and again["instance"].endswith(".1")
        assert first["api"]["instance"] is None

        api = f"http://127.0.0.1:{api_port}"
        r = httpx.get(f"{api}/health", timeout=5)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(api, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(AgentConfig())
        async with MemlaneClient(api, key, session="s1") as c:
            await c.add_memory("The supervisor brought the ledger back", kind="fact")
            hits, _ = await c.search_memory("supervisor ledger", mode="lexical")
            assert [h.record.summary for h in hits] == ["The supervisor brought the ledger back"]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, output()[-3000:]
        await eventually(lambda: not any(_alive(p) for p in seen_pids), timeout=10)
        text = output()
        assert "stopped every process" in text
        assert "did not stop in time" not in text  # every child stopped on SIGTERM, none was killed
        assert status()["phase"] == "stopped" and not any(c["pid"] for c in children().values())
    finally:
        if proc.poll() is None:
            proc.kill()  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
            proc.wait()
        for pid in seen_pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
