"""`serve` and `memlane rebuild` on a Qdrant server through qdrant-client: a collection per
generation and shard, and the shard aliases swapped to the rebuilt generation.

With QDRANT_URL in the environment this runs against that server. Without one it runs in
qdrant-client's local mode (MEMLANE_QDRANT_LOCAL_PATH): the same calls, in-process, as a
protocol check. Local mode locks a directory to one process, and here `serve` holds one
generation while the rebuild's shard processes write the next, so each collection has a
directory of its own and the aliases live in a catalog directory each process opens for one
call at a time (docs/operations/qdrant-server.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from events.config import AgentConfig
from services.bootstrap import index_generations
from services.client import MemlaneClient
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import new_agent

AGENT_SCOPE = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
FACTS = (
    "The staging database is called mercury-db",
    "Backups run nightly at 02:00 UTC",
    "Ticket INC-40417 was escalated to the platform team",
    "The customer is furious about the late parcel",
    "Deploys go out on Tuesdays after the standup",
)
QUERIES = (("what is the staging database called?", "hybrid"), ("INC-40417", "lexical"),
           ("client angry about a delayed delivery", "vector"), ("when do we deploy?", "hybrid"))


# The bare deployment, before any module of it writes a memory record: the test checks a new
# deployment's generation 1 and its exact point count. Its processes keep memory in qdrant-client
# collections (the session stack keeps it in Edge shards), under a data directory of their own.
@pytest.fixture
def qstack(bare_stack, tmp_path):
    stack, own = bare_stack.stack, bare_stack.settings
    data = tmp_path / "data"
    # A real server when one is configured, else local mode in this data directory.
    local = None if os.environ.get("QDRANT_URL") else data / "qdrant-local"
    backend = {"MEMLANE_DATA_DIR": str(data), **({"MEMLANE_QDRANT_LOCAL_PATH": str(local)} if local else {})}
    qsettings = own.model_copy(update={"data_dir": data, "qdrant_local_path": local})
    stack.start_all(workers=("ledger", "embedding", "redis-projection"), **backend)
    try:
        yield stack, qsettings, {**stack.env, **backend}
    finally:
        stack.stop()
        if os.environ.get("QDRANT_URL"):  # a shared server keeps nothing of a test run
            cols = index_generations(qsettings).collections()
            for gen in cols.generations():
                cols.drop(gen)


def aliases(settings: Settings) -> dict[str, str]:
    cols = index_generations(settings).collections()
    with cols.catalog() as c:
        return {a.alias_name: a.collection_name for a in c.get_aliases().aliases if a.alias_name.startswith(cols.prefix)}


async def test_rebuild_builds_a_new_generation_collection_and_swaps_the_aliases(qstack):
    stack, settings, env = qstack
    cols = index_generations(settings).collections()
    assert cols is not None and settings.qdrant_client_mode
    _, _, key = await new_agent(stack.api_url, settings.operator_key, AGENT_SCOPE)
    health = httpx.get(f"{stack.api_url}/health").json()["projection"]
    shards = health["shards"]
    assert health["generation"] == 1
    # A new deployment's first generation: a collection per shard, each aliased, and no Edge shard.
    assert aliases(settings) == {cols.alias(k): cols.name(1, k) for k in range(shards)}
    assert not list(index_generations(settings).root.glob("memory-g*"))

    async with MemlaneClient(stack.api_url, key) as c:
        for text in FACTS:
            await c.add_memory(text, scope="AGENT")  # answers once searchable

        async def searches() -> list[list[str]]:
            out = []
            for query, mode in QUERIES:
                hits, _ = await c.search_memory(query, mode=mode)
                out.append([h.record.summary for h in hits])
            return out

        before = await searches()
        assert [b[0] for b in before] == [FACTS[0], FACTS[2], FACTS[3], FACTS[4]]

        proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild", "--target", "qdrant"],
                              env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        # The rebuild swapped the aliases; `serve` follows them to the new generation.
        assert aliases(settings) == {cols.alias(k): cols.name(2, k) for k in range(shards)}

        def switched():
            return httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"] == 2

        await eventually(switched, timeout=30, interval=0.2)
        assert set(cols.generations()) == {1, 2}  # the previous generation is kept
        assert await searches() == before
        after = httpx.get(f"{stack.api_url}/health").json()["projection"]
        assert after["points"] == len(FACTS) and after["caught_up"]

        # The new generation's projection follows the log: a write after the swap is searchable.
        await c.add_memory("Rebuilds keep the pipeline live", scope="AGENT")
        hits, _ = await c.search_memory("pipeline live", mode="lexical")
        assert [h.record.summary for h in hits] == ["Rebuilds keep the pipeline live"]

    # `replay` fills a named generation's collections and leaves the aliases alone.
    proc = subprocess.run([sys.executable, "-m", "services.cli", "replay", "--target", "qdrant", "--generation", "9"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    replayed = 0
    for k in range(shards):
        index = cols.open(9, k)
        try:
            replayed += index.count()
        finally:
            index.close()
    assert replayed == len(FACTS) + 1
    assert aliases(settings) == {cols.alias(k): cols.name(2, k) for k in range(shards)}

    # Another rebuild: generation 3 goes live, 2 is kept to switch back to, 1 is dropped
    # (collections and checkpoints); a generation above the live one is not the rebuild's.
    proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild", "--target", "qdrant"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(cols.generations()) == {2, 3, 9} and cols.live() == 3
    assert not [p for p in (settings.qdrant_local_path or index_generations(settings).root / "server").glob("*memory-g1-*")]
