"""`memlane rebuild` fills new Redis and Qdrant generations from the log and switches readers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx

from events.config import member_facts
from services.bootstrap import keys_at
from services.client import MemlaneClient
from services.stack import stack_env
from tests.conftest import eventually
from tests.redis_at import redis_at


def no_embedding_env(env: dict[str, str], tmp_path) -> tuple[dict[str, str], object]:
    """`env` with onnxruntime shadowed by a module that notes the process and refuses to load,
    so a process (or a shard process it starts) that embeds leaves a note and fails."""
    shadow = tmp_path / "no_embedding"
    (shadow / "onnxruntime").mkdir(parents=True)
    (shadow / "onnxruntime" / "__init__.py").write_text(
        "import os\n"
        "with open(os.environ['MEMLANE_TEST_EMBED_NOTE'], 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "raise ImportError('embedding is switched off in this test')\n"
    )
    note = tmp_path / "embedded"
    return {**env, "PYTHONPATH": f"{shadow}{os.pathsep}{env['PYTHONPATH']}", "MEMLANE_TEST_EMBED_NOTE": str(note)}, note


def test_the_embedding_shadow_catches_a_process_that_embeds(tmp_path):
    env, note = no_embedding_env(stack_env(), tmp_path)
    proc = subprocess.run([sys.executable, "-c", "from projections.embedders.onnx import OnnxMiniLM; OnnxMiniLM().embed(['x'])"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "embedding is switched off" in proc.stderr
    assert note.read_text().strip().isdigit()


async def members_of(stack, settings, tenant: str, agent: str) -> dict:
    """What the view knows of an agent's members: the operator's counts and consent, each
    member's consent, and each member's own facts (by their keys)."""
    out = {}
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        out["subjects"] = await op.subjects()
        for user in ("dana", "erin"):
            async with MemlaneClient(stack.api_url, await op.issue_key(tenant, agent, "member", user=user)) as m:
                out[user] = ((await m.consent())["consent"], (await m.list_memory())["records"])
    return out


async def test_rebuild_switches_generations_and_keeps_every_record(stack, new_agent, settings, tmp_path):
    tenant, agent, key = await new_agent()
    # A members' agent: consent granted, withdrawn, granted again; facts kept, edited, deleted.
    mtenant, magent, mkey = await new_agent(member_facts())
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=mtenant, agent=magent) as op:
        keys = {u: await op.issue_key(mtenant, magent, "member", user=u) for u in ("dana", "erin")}
    for user in ("dana", "erin"):
        async with MemlaneClient(stack.api_url, keys[user]) as m:
            await m.grant_consent()
        async with MemlaneClient(stack.api_url, mkey, user=user, channel="api") as c:
            kept = await c.add_memory(f"{user} likes tea", kind="profile", key="drink")
            gone = await c.add_memory(f"{user} lives in Lyon", kind="profile", key="city")
        async with MemlaneClient(stack.api_url, keys[user]) as m:
            await m.edit_memory(kept["id"], summary=f"{user} likes green tea")
            await m.delete_memory(gone["id"])
            if user == "erin":
                await m.withdraw_consent()
    members_before = await members_of(stack, settings, mtenant, magent)
    assert members_before["dana"][0] == "granted" and members_before["erin"][0] == "withdrawn"
    assert [r["summary"] for r in members_before["erin"][1]] == ["erin likes green tea"]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        await op.curate_block("conventions", "add", line="Deploys go out on Tuesdays")
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        first = await c.add_memory("The staging database is called mercury-db", kind="fact")
        second = await c.add_memory("Backups run nightly at 02:00", kind="fact")
        await c.add_memory("The staging database is called venus-db", kind="fact", replaces=first["id"])
        before = {r: [v.model_dump() for v in await c.history(r)] for r in (first["id"], second["id"])}
        health = httpx.get(f"{stack.api_url}/health").json()
        old_gen = health["projection"]["generation"]

        # A rebuild never embeds: it completes with the embedding runtime unloadable, and
        # neither it nor its shard processes tried to load it.
        env, embedded = no_embedding_env(stack.env, tmp_path)
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli", "rebuild", "--target", "all"],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "redis: generation" in proc.stdout and "qdrant: generation" in proc.stdout
        assert not embedded.exists(), f"processes {embedded.read_text().split()} loaded the embedding runtime"

        def switched():
            return httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"] > old_gen

        await eventually(switched, timeout=60)
        after = {r: [v.model_dump() for v in await c.history(r)] for r in (first["id"], second["id"])}
        assert after == before
        assert await c.blocks() == [{"scope": "agent", "label": "conventions", "text": "Deploys go out on Tuesdays"}]
        # The same members, consent and facts, from the log alone.
        assert await members_of(stack, settings, mtenant, magent) == members_before
        hits, _ = await c.search_memory("what is the staging database called?")
        assert hits[0].record.summary == "The staging database is called venus-db"
        assert all(h.record.summary != "The staging database is called mercury-db" for h in hits)
        # The switched projections keep following the log.
        await c.add_memory("Rebuilds keep the pipeline live", kind="fact")
        hits, _ = await c.search_memory("pipeline live", mode="lexical")
        assert hits and hits[0].record.summary == "Rebuilds keep the pipeline live"


async def test_rebuilds_keep_only_the_live_and_the_previous_generation(stack, settings, new_agent):
    from projections.redis.record_view import RedisRecords
    from services.bootstrap import index_generations

    _, _, key = await new_agent()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        await c.add_memory("Generations come and go", kind="fact")
    # The second from a process that has opened an Edge shard: its native threads could
    # hold a lock at the fork, which a forked child would wait on forever, so spawn.
    edge_first = ("import pathlib, sys, tempfile; from projections.qdrant.index import EdgeIndex; "
                  "EdgeIndex(pathlib.Path(tempfile.mkdtemp()) / 'x'); "
                  "from services.cli import main; sys.exit(main(['rebuild']))")
    for cmd, method in (([sys.executable, "-m", "services.cli", "rebuild"], "fork"),
                        ([sys.executable, "-c", edge_first], "spawn")):
        proc = subprocess.run(cmd, env=stack.env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f'"start_method": "{method}"' in proc.stderr
    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        live = await store.generation()
        assert live >= 3
        assert await store.generations() == [live - 1, live]
        stale = [k async for k in store.r.scan_iter(f"{store.root}g{live - 2}:*", count=10_000)]
        assert stale == []
    finally:
        await store.aclose()
    shards = sorted(p.name for p in index_generations(settings).root.glob("memory-g*") if p.is_dir())
    current = int((index_generations(settings).root / "CURRENT").read_text())
    assert shards == sorted([f"memory-g{current - 1}", f"memory-g{current}"])


async def test_replay_moves_a_named_qdrant_generation_forward_only(stack, settings, new_agent):
    from projections.qdrant.index import EdgeIndex
    from services.bootstrap import index_generations

    _, _, key = await new_agent()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        await c.add_memory("Replays fill a generation up to an offset", kind="fact")
    gen = 90 + int(uuid.uuid4().int % 1000)

    def replay(*extra):
        return subprocess.run([sys.executable, "-m", "services.cli", "replay", "--target", "qdrant",
                               "--generation", str(gen), *extra], env=stack.env, capture_output=True, text=True,
                              timeout=300)

    def points():
        total = 0
        for path in index_generations(settings).paths(gen):
            index = EdgeIndex(path)
            try:
                total += index.count()
            finally:
                index.close()
        return total

    first = replay("--to-offset", "0")
    assert first.returncode == 0, first.stderr[-2000:]
    assert points() == 0
    rest = replay()
    assert rest.returncode == 0, rest.stderr[-2000:]
    live = httpx.get(f"{stack.api_url}/health").json()["projection"]["points"]
    assert points() == live > 0
    backwards = replay("--from-offset", "0")
    assert backwards.returncode == 2 and "a replay continues from there" in backwards.stderr


def test_a_rebuild_of_a_prefix_with_no_topics_says_what_to_do(stack):
    env = {**stack.env, "MEMLANE_TOPIC_PREFIX": f"nothing{uuid.uuid4().hex[:6]}."}
    proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "nothing has been written under the topic prefix" in proc.stderr
    assert "MEMLANE_TOPIC_PREFIX" in proc.stderr and "Traceback" not in proc.stderr


async def test_a_rebuild_after_an_erasure_leaves_out_what_it_cannot_open_and_counts_it(stack, settings, new_agent):
    """A member erased on an agent and their keys destroyed (as the ledger does): the rebuilt
    generations hold none of their facts, the log still holds them sealed, and the rebuild
    says how many events it left out. The agent's own facts come back as they were."""
    import json

    from events import SubjectErased
    from events.base import utcnow
    from events.sealing import subject_of
    from events.topics import EVENTS
    from tests.e2e.extraction_support import send_to
    from workers.runtime.data_keys import open_keys

    tenant, agent, key = await new_agent(member_facts())
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        member_keys = {u: await op.issue_key(tenant, agent, "member", user=u) for u in ("fay", "gus")}
    fay_key = member_keys["fay"]
    said = {"fay": ("fay keeps bees", "fay's locker is 12"), "gus": ("gus inspects the hive on Mondays",)}
    for user, texts in said.items():
        async with MemlaneClient(stack.api_url, member_keys[user]) as m:
            await m.grant_consent()
        async with MemlaneClient(stack.api_url, key, user=user, channel="api") as c:
            for text in texts:
                await c.add_memory(text, kind="profile")

    keys = await open_keys(settings, keys_at(settings)(), follow=False)
    try:
        erasure = SubjectErased(event_id=str(uuid.uuid4()), command_id=f"erase-{uuid.uuid4().hex[:8]}",
                                tenant=tenant, agent=agent, occurred_at=utcnow(), user="fay")
        await send_to(settings, EVENTS, erasure)
        assert await keys.destroy(subject_of(tenant, agent, "fay")) >= 1
    finally:
        await keys.stop()

    async with MemlaneClient(stack.api_url, fay_key) as fay:
        async def purged() -> bool:  # the live view drops her facts first
            return (await fay.list_memory())["records"] == []

        await eventually(purged, timeout=60)
    old_gen = httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"]
    proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild"], env=stack.env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = [json.loads(line) for line in proc.stderr.splitlines()
               if line.startswith("{") and '"rebuild_skipped_unreadable"' in line]
    # Each of fay's two records is left out of both views (and her vectors are never opened).
    assert reports and sum(r["events"] for r in reports) >= 4, reports
    assert "fay keeps bees" not in proc.stderr and "locker" not in proc.stderr

    await eventually(lambda: httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"] > old_gen,
                     timeout=60)
    async with MemlaneClient(stack.api_url, fay_key) as fay:
        assert (await fay.list_memory())["records"] == []
    async with MemlaneClient(stack.api_url, member_keys["gus"]) as gus:
        assert [r["summary"] for r in (await gus.list_memory())["records"]] == ["gus inspects the hive on Mondays"]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        assert [(s["user"], s["facts"]) for s in (await op.subjects())["subjects"]] == [("gus", 1)]
    async with MemlaneClient(stack.api_url, key, user="gus", channel="api") as c:
        hits, _ = await c.search_memory("hive inspects Mondays", mode="lexical")
        assert [h.record.summary for h in hits] == ["gus inspects the hive on Mondays"]
