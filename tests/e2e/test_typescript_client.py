"""The TypeScript client (clients/typescript) against the shared stack: its own tests, run by
node's test runner, call the live API with an agent key and the deployment's operator key."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=CLIENT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


async def test_the_typescript_client_passes_its_tests_against_the_live_api(stack, settings, new_agent):
    assert (CLIENT / "node_modules").is_dir(), "clients/typescript is not installed: run make install"
    built = await asyncio.to_thread(node, "npm", "run", "build")
    assert built.returncode == 0, built.stdout + built.stderr
    tenant, agent, key = await new_agent({"memory": {"tools": ["add_memory", "read_memory", "delete_memory"]}})
    ran = await asyncio.to_thread(node, "node", "--test", "dist/test/", env={
        "MEMLANE_URL": stack.api_url, "MEMLANE_KEY": key, "MEMLANE_OPERATOR_KEY": settings.operator_key,
        "MEMLANE_TENANT": tenant, "MEMLANE_AGENT": agent})
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    assert "# pass 6" in ran.stdout and "# fail 0" in ran.stdout, ran.stdout[-3000:]
