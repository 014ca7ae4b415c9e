"""The canary test of encryption at rest and erasure, on a stack of its own.

A unique string is written for one member as a fact (HTTP, user scope), as a history
message (a turn on `memlane.turns`, which the extraction worker also makes a fact of), and
in a turn the fake model answers with garbage (so it is dead-lettered); a second one is
written as a line of the agent's block. Then every byte memlane keeps is searched
(tests/e2e/canary_support.py says where and how):

1. before erasure, the member's canary is in `memlane.turns`' segments (the platform's
   plaintext: the search works) and nowhere else; the block's canary is nowhere;
2. after `DELETE /v1/subjects/{user}`, the member's canary is nowhere outside
   `memlane.turns`, the erased facts and messages are not served (the member grants consent
   again first, so nothing is merely gated), and the wrapped data keys of the member's
   subject leave the `memlane.keys` segments once the broker compacts them;
3. after `DELETE /v1/agent`, with the whole stack stopped, neither canary is anywhere
   outside `memlane.turns`, and no dead letter of the member's turns opens with the keys left.

Before each search the API is stopped (its Edge shards flush on the way out) and the ledger
restarted once it has decided every command (its recovery snapshots each partition), so
the shards and the ledger snapshots on disk hold everything written so far; the ledger runs
with `snapshot_every = 1` (canary_support.CanaryStack) so snapshots exist at all. A probe,
the agent's id, must be found in every place before erasure: a place where it is not was
not really read.

Every check is collected and the test fails once at the end, naming each place found, so
one run reports the whole picture. Port: MEMLANE_TEST_CANARY_API_PORT (default 28330);
MEMLANE_CANARY_KEEP=1 keeps the stack's data directory (logs included) for a look.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from events import AgentConfig, member_facts
from services.client import MemlaneClient, MemlaneError, TurnPublisher
from services.stack import stack_env
from settings import Settings
from tests.conftest import eventually
from tests.e2e import canary_support as cs
from tests.e2e.canary_support import Canary, CanaryStack, Finding, Scan
from tests.e2e.extraction_support import turn
from tests.fakes.model_server import Raw, Reply
from workers.processors.ledger import snapshot_file as ledger_snapshot

USER = "dana"
TOOLS = ["add_memory", "read_memory", "delete_memory", "curate_block"]
CONFIG = AgentConfig.model_validate({
    **member_facts(tools=TOOLS).model_dump(mode="json"), "history": {"index": "messages"}})
KEYS_SEGMENT_MS = 2000
# The broker's log cleaner looks for work every log.cleaner.backoff.ms (15 s unless set in
# deploy/local/kafka.sh), after the keys topic's segment.ms has rolled the tombstone's segment.
COMPACTION_TIMEOUT_S = float(os.environ.get("MEMLANE_TEST_COMPACTION_TIMEOUT_S", "45"))


def _port() -> int:
    port = int(os.environ.get("MEMLANE_TEST_CANARY_API_PORT", "28330"))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no clash
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            pytest.fail(f"port {port} is taken: set MEMLANE_TEST_CANARY_API_PORT to a free one")
    return port


@dataclasses.dataclass
class Ctx:
    stack: CanaryStack
    settings: Settings
    log_dir: Path  # the broker's
    tails: cs.Tails

    @property
    def prefix(self) -> str:
        return self.settings.topic_prefix

    @property
    def keys_topic(self) -> str:
        return self.settings.topic("memlane.keys")


# A stack of its own: the test scans every byte its topics, Redis keys and data files hold for the
# canary, with short key segments of its own, so nothing of another test may be in them.
@pytest.fixture(scope="module")
def canary(fake, infra, settings):
    if infra:
        pytest.skip("the canary test reads the broker's and Redis's files: it needs the local Kafka and Redis")
    log_dir = cs.broker_log_dir()
    if log_dir is None or not log_dir.is_dir():
        pytest.skip("the local broker's log directory was not found (deploy/local/kafka.sh; MEMLANE_KAFKA_LOG_DIR)")
    prefix = f"{settings.topic_prefix}canary{uuid.uuid4().hex[:6]}."  # deleted with the run's topics
    # Not under pytest's basetemp: another pytest session started meanwhile (the tree is
    # shared) deletes all but the newest three, and this stack's data dir with them.
    root = Path(tempfile.mkdtemp(prefix="memlane-canary-"))
    data_dir, key_file = root / "data", root / "keys" / "memlane.key"
    data_dir.mkdir()
    port = _port()
    env = stack_env(
        MEMLANE_TOPIC_PREFIX=prefix, MEMLANE_DATA_DIR=str(data_dir), MEMLANE_API_PORT=str(port),
        MEMLANE_KEY_FILE=str(key_file), MEMLANE_KEYS_SEGMENT_MS=str(KEYS_SEGMENT_MS),
        OPENAI_BASE_URL=fake.url, OPENAI_API_KEY="test-key", MEMLANE_EMBEDDINGS="openai",
        MEMLANE_MODEL_RETRIES="0", MEMLANE_CONFIG_CACHE_S="0.5",
    )
    csettings = Settings(topic_prefix=prefix, data_dir=data_dir, api_port=port, key_file=key_file,
                         keys_segment_ms=KEYS_SEGMENT_MS)
    tails = cs.Tails()
    tails.mark(cs.broker_logs() + cs.redis_aof_files(csettings.redis_url))
    stack = CanaryStack(env, data_dir / "logs")
    try:
        stack.start_all()
        yield Ctx(stack, csettings, log_dir, tails)
    finally:
        stack.stop()
        if os.environ.get("MEMLANE_CANARY_KEEP"):
            print(f"canary stack's files kept in {root}; its Redis keys hold {prefix}")
        else:
            shutil.rmtree(root, ignore_errors=True)
            cs.drop_redis_keys(csettings.redis_url, prefix)


# ------------------------------------------------------------------------------ scanning


async def scan_everything(ctx: Ctx, phase: str, canaries: list[Canary], probe: Canary, api_stopped: bool) -> Scan:
    """Every place, for the canaries and for the probe (a plain id every place holds: a
    place where the probe is not found was not really read)."""
    t0 = time.monotonic()
    everything = [*canaries, probe]
    s = Scan(phase)
    clock = [t0]

    def lap(name: str) -> None:
        now = time.monotonic()
        s.took[name] = now - clock[0]
        clock[0] = now

    turns = cs.scan_segments(ctx.log_dir, ctx.prefix, everything, turns=True)
    s.findings += [dataclasses.replace(f, place="kafka-turns") for f in turns]
    s.findings += cs.scan_segments(ctx.log_dir, ctx.prefix, everything)
    s.read["partition dirs"] = len(cs.topic_dirs(ctx.log_dir, ctx.prefix))
    lap("segments")
    s.findings += await cs.scan_records(ctx.settings.kafka_bootstrap, ctx.prefix, everything)
    lap("records")
    redis_found, s.read["redis keys"] = await cs.scan_redis(ctx.settings.redis_url, ctx.settings.redis_root,
                                                              ctx.prefix, everything)
    s.findings += redis_found
    aof = cs.redis_aof_files(ctx.settings.redis_url)
    s.read["aof files"] = len(aof)
    s.findings += ctx.tails.scan(aof, everything, "redis-aof")
    lap("redis")
    for sub, place in (("ledger", "ledger-snapshot"), ("qdrant", "qdrant-file"), ("logs", "stack-log")):
        s.findings += cs.scan_tree(ctx.settings.data_dir / sub, everything, place)
        s.read[place + " files"] = sum(len(f) for _, _, f in os.walk(ctx.settings.data_dir / sub))
    s.findings += cs.scan_tree(ctx.settings.data_dir, everything, "file", exclude=re.compile(r"^(ledger|qdrant|logs)/"))
    s.findings += ctx.tails.scan(cs.broker_logs(), everything, "infra-log")
    lap("files")
    if api_stopped:
        found, s.read["edge points"] = cs.scan_payloads(ctx.settings.data_dir, everything)
        s.findings += found
        lap("payloads")
    probes = {f.place for f in s.findings if f.canary == probe.name}
    s.findings = [f for f in s.findings if f.canary != probe.name]
    s.read["probe seen in"] = len(probes)
    s.seconds = time.monotonic() - t0
    s.probes = probes
    return s


# Where the probe (the agent's id) must be found once the canaries are written: a scanner
# that does not find it there did not really read that place.
PROBED = {"kafka-turns", "kafka-segment", "kafka-record", "redis", "redis-aof", "ledger-snapshot", "qdrant-file",
          "qdrant-payload", "stack-log"}


def blind_places(scan: Scan) -> list[str]:
    return sorted(PROBED - scan.probes)


def places(findings: list[Finding]) -> str:
    return "\n".join(f"    {f}" for f in findings)


# ------------------------------------------------------------------------------ helpers


def snapshot_offsets(ctx: Ctx) -> dict[int, int]:
    out = {}
    for p in range(8):
        snap = ledger_snapshot.read(ledger_snapshot.path_for(ctx.settings, p))
        if snap is not None:
            out[p] = snap.next_offset
    return out


async def partition_ends(ctx: Ctx, topic: str) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=ctx.settings.kafka_bootstrap)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(8)]
        return {tp.partition: o for tp, o in (await c.end_offsets(tps)).items()}
    finally:
        await c.stop()


async def event_ends(ctx: Ctx) -> dict[int, int]:
    return await partition_ends(ctx, ctx.settings.topic("memlane.memory.events"))


def with_canary(obj, c: Canary) -> bool:
    return c.core in json.dumps(obj, default=str).lower()


def log_errors(ctx: Ctx, since: dict[str, int]) -> list[str]:
    """Error lines the stack's processes logged after `since` (byte offsets per log file)."""
    out = []
    for p in sorted(ctx.stack.log_dir.glob("*.log")):
        with open(p, "rb") as f:
            f.seek(since.get(p.name, 0))
            for line in f.read().decode("utf-8", "replace").splitlines():
                if '"level": "error"' in line or re.match(r"^[A-Za-z_.]+(Error|Exception)\b", line):
                    out.append(f"{p.name}: {line[:300]}")
    return out


def log_sizes(ctx: Ctx) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in ctx.stack.log_dir.glob("*.log")}


# ------------------------------------------------------------------------------ the test


class Run:
    """One run of the canary test: what it wrote, what it found, what went wrong."""

    def __init__(self, ctx: Ctx, fake) -> None:
        self.ctx, self.fake = ctx, fake
        self.api, self.op_key = ctx.stack.api_url, ctx.settings.operator_key
        self.fact_c, self.block_c = Canary.new("member"), Canary.new("block")
        self.tenant, self.agent = f"ten{uuid.uuid4().hex[:8]}", f"agent{uuid.uuid4().hex[:8]}"
        self.probe = Canary("probe", self.agent)
        self.member_subject = f"{self.tenant}/{self.agent}|u:{USER}"
        self.agent_subject = f"{self.tenant}/{self.agent}"
        self.problems: list[str] = []
        self.scans: list[Scan] = []
        self.timings: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.logs_at = log_sizes(ctx)
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.member_keys: list[cs.KeyEntry] = []
        self.agent_keys: list[cs.KeyEntry] = []
        self.fact_ids: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.problems.append(what)

    def lap(self, name: str) -> None:
        self.timings[name] = time.monotonic() - self.t0
        self.errors += log_errors(self.ctx, self.logs_at)
        self.logs_at = log_sizes(self.ctx)

    def clients(self) -> None:
        self.op = MemlaneClient(self.api, self.op_key, tenant=self.tenant, agent=self.agent)
        self.member = MemlaneClient(self.api, self.member_key)
        self.as_agent = MemlaneClient(self.api, self.agent_key, user=USER, session="s-api", channel="api")
        self.hist = MemlaneClient(self.api, self.agent_key, user=USER, session="s-hist", channel="studio")

    async def close(self) -> None:
        for name in ("op", "member", "as_agent", "hist"):
            if (c := getattr(self, name, None)) is not None:
                await c.aclose()

    # ---------------------------------------------------------------- writing

    async def write(self) -> None:
        """The member's canary as a fact (HTTP), a history message (a turn, which extraction
        makes a second fact of) and a dead-lettered turn; the block's as a block line."""
        ctx, fact_c = self.ctx, self.fact_c
        async with MemlaneClient(self.api, self.op_key, tenant=self.tenant, agent=self.agent) as op:
            await op.configure(CONFIG)
            self.agent_key = await op.issue_key(self.tenant, self.agent)
            self.member_key = await op.issue_key(self.tenant, self.agent, "member", user=USER)
        self.clients()
        assert (await self.member.grant_consent())["consent"] == "granted"
        added = await self.as_agent.add_memory(f"{USER.title()}'s garden gnome is named {fact_c.text}", kind="profile")
        assert added["status"] == "applied", added
        await self.op.curate_block("greeting", "add", line=f"Greet the team with the word {self.block_c.text}")

        ok, bad = f"mk{uuid.uuid4().hex[:10]}", f"mk{uuid.uuid4().hex[:10]}"
        self.fake.on(ok, Reply({"candidates": [{
            "decision": "add", "handle": None, "kind": "profile", "labels": {}, "key": None, "scope": "user",
            "summary": f"Has a garden gnome named {fact_c.text}", "content": "", "source_message_ids": []}]}))
        self.fake.on(bad, *(Raw("this is not the JSON you asked for") for _ in range(4)))
        async with TurnPublisher(ctx.settings.kafka_bootstrap, ctx.prefix) as pub:
            await pub.publish(turn(self.tenant, self.agent, "s-hist", 1,
                                   f"Remember that my garden gnome is called {fact_c.text} {ok}",
                                   "Noted, I will remember the gnome.", user=USER, channel="studio"))
            await pub.publish(turn(self.tenant, self.agent, "s-dlq", 1, f"My parrot answers to {fact_c.text} {bad}",
                                   "Nice.", user=USER, channel="studio"))

        # Everything landed (searched by other words: a query is kept too, and would plant the canary).
        async def two_facts():
            found = [r for r in (await self.member.list_memory())["records"] if with_canary(r, fact_c)]
            return found if len(found) >= 2 else None

        self.fact_ids = [r["id"] for r in await eventually(two_facts, timeout=40)]

        async def in_memory_search():
            hits = (await self.as_agent.search_memory("garden gnome", mode="lexical"))[0]
            return len([h for h in hits if fact_c.core in h.record.summary.lower()]) >= 2

        await eventually(in_memory_search, timeout=30)

        async def in_history():
            return with_canary((await self.hist.search_history("garden gnome"))["events"], fact_c)

        await eventually(in_history, timeout=30)

        async def dead_lettered():
            return await cs.read_all(ctx.settings.kafka_bootstrap, [ctx.settings.topic("memlane.turns.dlq")]) or None

        await eventually(dead_lettered, timeout=40)
        assert any(with_canary(b, self.block_c) for b in await self.op.blocks()), "the block line is not served"
        keys = await cs.key_entries(ctx.settings.kafka_bootstrap, ctx.keys_topic)
        self.member_keys = [k for k in keys.values() if k.subject == self.member_subject and k.wrapped]
        self.agent_keys = [k for k in keys.values() if k.subject == self.agent_subject and k.wrapped]
        self.check(bool(self.member_keys), f"no data key of the member's subject {self.member_subject} on "
                                           f"{ctx.keys_topic}: nothing was sealed under it")
        self.check(bool(self.agent_keys), f"no data key of the agent's subject {self.agent_subject} on "
                                          f"{ctx.keys_topic}: the block was not sealed under it")
        self.lap("written")

    # ---------------------------------------------------------------- scanning

    async def flush_and_snapshot(self) -> None:
        """Stops the API (its Edge shards are flushed on the way out) and restarts the ledger
        (its recovery snapshots every partition it folds); returns once every partition with
        events has a snapshot that folds all of them."""
        self.ctx.stack.stop_one("api")
        await self.resnapshot()

    async def resnapshot(self) -> None:
        """Once the ledger has decided every command sent (the API, the only writer left,
        is stopped), restarts it: its recovery snapshots each partition it folds."""
        async def drained():
            return await commands_drained(self.ctx)

        try:
            await eventually(drained, timeout=30, interval=0.3)
        except AssertionError:
            self.problems.append("the ledger did not decide every command within 30 s")
        self.ctx.stack.stop_one("ledger")
        self.ctx.stack.start("ledger")

        async def current():
            return await snapshots_current(self.ctx)

        try:  # a loaded machine takes a while to start a worker and join its group
            await eventually(current, timeout=30, interval=0.3)
        except AssertionError:
            self.problems.append(f"the ledger's snapshots do not fold every event: {snapshot_offsets(self.ctx)} "
                                 f"against partition ends {await event_ends(self.ctx)}")

    async def scan(self, phase: str, api_stopped: bool = True) -> Scan:
        s = await scan_everything(self.ctx, phase, [self.fact_c, self.block_c], self.probe, api_stopped)
        self.scans.append(s)
        return s

    async def before_erasure(self) -> None:
        await self.flush_and_snapshot()
        s = await self.scan("before erasure")
        self.ctx.stack.start("api")
        await asyncio.to_thread(self.ctx.stack.wait_healthy, 60)
        blind = blind_places(s)
        self.check(not blind, f"before erasure, the probe (the agent's id {self.agent!r}) was not found in {blind}: "
                              "those places were not really read")
        self.check(any(f.place == "kafka-turns" and f.canary == self.fact_c.name for f in s.findings),
                   f"the member's canary is not in {self.ctx.prefix}memlane.turns' segments: the search is blind")
        leaked = s.outside_turns(self.fact_c) + s.outside_turns(self.block_c)
        self.check(not leaked, f"before erasure, plaintext outside memlane.turns:\n{places(leaked)}")
        self.lap("scanned before erasure")

    # ---------------------------------------------------------------- erasing the member

    async def erase_member(self) -> None:
        ctx = self.ctx
        try:
            erased = await self.op.erase_subject(USER)
            self.check(erased.get("erased", 0) >= 2, f"DELETE /v1/subjects/{USER} answered {erased}")
        except MemlaneError as e:  # recorded; the erasure may still be applied: the checks below say
            self.problems.append(f"DELETE /v1/subjects/{USER} failed: {e}")

        async def erased_in_view():  # no live fact counted for the member (listed with 0, or not at all)
            return not [s for s in (await self.op.subjects())["subjects"] if s["user"] == USER and s["facts"]]

        try:
            await eventually(erased_in_view, timeout=10)
        except AssertionError:
            self.problems.append(f"10 s after DELETE /v1/subjects/{USER}, GET /v1/subjects still counts their facts: "
                                 f"{(await self.op.subjects())['subjects']}")

        async def keys_destroyed():
            now = await cs.key_entries(ctx.settings.kafka_bootstrap, ctx.keys_topic)
            return not [k for k in self.member_keys if now.get(k.kid) and now[k.kid].wrapped] or None

        try:
            await eventually(keys_destroyed, timeout=15)
        except AssertionError:
            self.problems.append(f"after erasure, no tombstone on {ctx.keys_topic} for the member's data keys "
                                 f"{[k.kid for k in self.member_keys]}")
        # Not merely gated: the member grants consent again, and nothing of the canary is served.
        assert (await self.member.grant_consent())["consent"] == "granted"
        served: dict[str, object] = {}
        for mode in ("lexical", "vector", "hybrid"):
            served[f"memory search ({mode})"] = [h.record.model_dump(mode="json") for h in
                                                 (await self.as_agent.search_memory("garden gnome", mode=mode))[0]]
        served["member's list"] = (await self.member.list_memory())["records"]
        served["recall"] = await self.as_agent.recall("c-after", "what is my garden gnome called?")
        served["history search"] = (await self.hist.search_history("garden gnome"))["events"]
        served["history search (lexical)"] = (await self.hist.search_history("gnome", mode="lexical"))["events"]
        served["history listing"] = (await self.hist.search_history(None))["events"]
        for rid in self.fact_ids:
            for what, call in ((f"GET /v1/memory/{rid}", self.member.read_memory(rid)),
                               (f"GET /v1/memory/{rid}/history", self.member.history(rid))):
                try:
                    got = await call
                    served[what] = [v.model_dump(mode="json") for v in got] if isinstance(got, list) else \
                        got.model_dump(mode="json")
                except MemlaneError as e:
                    served[what] = {"status": e.status, "code": e.code}
                    self.check(e.status < 500, f"after erasure, {what} (the member's key) answered {e.status} "
                                               f"{e.code}: {e.message[:200]}")
                except httpx.HTTPError as e:
                    served[what] = {"error": type(e).__name__}
                    self.check(False, f"after erasure, {what} (the member's key) dropped the connection: "
                                      f"{type(e).__name__}")
        still = [what for what, got in served.items() if with_canary(got, self.fact_c)]
        self.check(not still, f"after erasure (and a new grant) the member's canary is still served by: {still}")
        self.lap("erased the member")

    async def after_erasure(self) -> None:
        opened = await cs.dlq_still_opens(self.ctx.settings, self.fact_c)
        if opened:
            self.notes.append(f"after erasing the member, dead letters of their turns still open with the keys left "
                              f"(sealed under the agent's key, not the member's): {opened}")
        await self.flush_and_snapshot()
        s = await self.scan("after erasing the member")
        self.ctx.stack.start("api")
        await asyncio.to_thread(self.ctx.stack.wait_healthy, 60)
        leaked = s.outside_turns(self.fact_c)
        self.check(not leaked, f"after erasing the member, their canary in plaintext outside memlane.turns:\n"
                               f"{places(leaked)}")
        leaked = s.outside_turns(self.block_c)
        self.check(not leaked, f"after erasing the member, the block's canary in plaintext:\n{places(leaked)}")
        self.lap("scanned after erasure")

    # ---------------------------------------------------------------- removing the agent

    async def remove_agent(self) -> None:
        ctx = self.ctx
        removed = await self.op.remove_agent()
        self.check(removed.get("status") == "applied", f"DELETE /v1/agent answered {removed}")
        try:
            self.check(not any(with_canary(b, self.block_c) for b in await self.op.blocks()),
                       "the removed agent's block is still served")
        except MemlaneError:
            pass  # refused: not served

        async def keys_destroyed():
            now = await cs.key_entries(ctx.settings.kafka_bootstrap, ctx.keys_topic)
            return not [k for k in self.agent_keys if now.get(k.kid) and now[k.kid].wrapped] or None

        if self.agent_keys:
            try:
                await eventually(keys_destroyed, timeout=15)
            except AssertionError:
                self.problems.append(f"after DELETE /v1/agent, no tombstone on {ctx.keys_topic} for the agent's "
                                     f"data keys {[k.kid for k in self.agent_keys]}")
        opened = await cs.dlq_still_opens(ctx.settings, self.fact_c)
        self.check(not opened, f"after DELETE /v1/agent, dead letters of the member's turns still open with the "
                               f"keys left: {opened}")
        self.lap("removed the agent")

    async def compacted(self) -> None:
        """The destroyed keys' wrapped bytes leave the keys topic's segment files once the
        broker's cleaner compacts it. The cleaner never touches the active segment, and a
        segment rolls (segment.ms) only on an append: each poll writes a fact for a new
        member of another agent, so a new data key is appended."""
        ctx = self.ctx
        now = await cs.key_entries(ctx.settings.kafka_bootstrap, ctx.keys_topic)
        tombstoned = [k for k in self.member_keys + self.agent_keys
                      if now.get(k.kid) is not None and now[k.kid].wrapped is None]
        if not tombstoned:
            self.problems.append(f"no destroyed data key to see compacted away on {ctx.keys_topic}")
            return
        rolled = 0
        roll_tenant = f"roll{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(self.api, self.op_key, tenant=roll_tenant, agent="roller") as rop:
            await rop.configure(AgentConfig())
            roll_key = await rop.issue_key(roll_tenant, "roller")

        # The pipeline still applies another agent's writes after the erasures (an event it can
        # no longer open must not wedge a projection).
        try:
            async with MemlaneClient(self.api, roll_key, session="s") as witness:
                await witness.add_memory("A witness fact written after the erasures")
        except MemlaneError as e:
            self.problems.append(f"after the erasures, another agent's write (wait=true) failed: {e}")

        def on_disk() -> list[str]:
            return cs.key_material_on_disk(ctx.log_dir, ctx.keys_topic, [k.wrapped for k in tombstoned])

        async def gone():
            nonlocal rolled
            rolled += 1
            async with MemlaneClient(self.api, roll_key, session="s", user=f"roller{rolled}") as roll:
                await roll.add_memory(f"Roller fact number {rolled}", wait=False)
            return not on_disk() or None

        try:
            await eventually(gone, timeout=COMPACTION_TIMEOUT_S, interval=KEYS_SEGMENT_MS / 1000 + 0.5)
        except AssertionError:
            self.problems.append(f"{COMPACTION_TIMEOUT_S:.0f} s after their tombstones, destroyed data keys are still "
                                 f"in {ctx.keys_topic}-0 segment files {on_disk()}")
        self.lap("keys compacted")

    # ---------------------------------------------------------------- everything stopped

    async def final(self) -> None:
        stack = self.ctx.stack
        try:
            stack.stop_one("api")
            await self.resnapshot()  # the final state's
        except AssertionError as e:
            self.problems.append(f"the final snapshot: {e}")
        self.lap("final snapshot")
        stack.stop()
        s = await self.scan("after removing the agent (stack stopped)")
        for c in (self.fact_c, self.block_c):
            leaked = s.outside_turns(c)
            self.check(not leaked, f"after removing the agent, the {c.name} canary in plaintext outside "
                                   f"memlane.turns:\n{places(leaked)}")
        self.lap("final scan")

    def report(self) -> str:
        lingering = cs.key_material_on_disk(self.ctx.log_dir, self.ctx.keys_topic,
                                            [k.wrapped for k in self.member_keys + self.agent_keys],
                                            suffixes=(".log", ".deleted", ".cleaned", ".swap"))
        named = cs.bytes_on_disk(self.ctx.log_dir, self.ctx.keys_topic,
                                 [k.kid.encode() for k in self.member_keys + self.agent_keys])
        return "\n".join([
            f"canaries: member {self.fact_c.core}, block {self.block_c.core}; tenant {self.tenant}, "
            f"agent {self.agent}; prefix {self.ctx.prefix}; data dir {self.ctx.settings.data_dir}",
            *(s.report() for s in self.scans),
            f"data keys: member's {[k.kid for k in self.member_keys]}, agent's {[k.kid for k in self.agent_keys]}; "
            f"files of {self.ctx.keys_topic}-0 still holding their wrapped bytes (any suffix): {lingering}; "
            f"segments still naming their ids (a tombstone's key, kept delete.retention.ms): {named}",
            "notes:", *([f"  {n}" for n in self.notes] or ["  (none)"]),
            "errors the stack logged:", *([f"  {e}" for e in self.errors[:20]] or ["  (none)"]),
            "timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items()),
        ])


async def commands_drained(ctx: Ctx) -> bool:
    """The ledger's group has committed every command on the commands topic."""
    from aiokafka.admin import AIOKafkaAdminClient

    topic = ctx.settings.topic("memlane.memory.commands")
    ends = await partition_ends(ctx, topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=ctx.settings.kafka_bootstrap)
    await admin.start()
    try:
        done = await admin.list_consumer_group_offsets(f"{ctx.settings.group_prefix}.{ctx.prefix}ledger")
    finally:
        await admin.close()
    committed = {tp.partition: m.offset for tp, m in done.items() if tp.topic == topic}
    return await cs.records_after(ctx.settings.kafka_bootstrap, topic,
                                  {p: committed.get(p, 0) for p, e in ends.items() if e > 0}) == 0


async def snapshots_current(ctx: Ctx) -> bool:
    """Every partition with events has a snapshot that folds all of them. The ledger writes
    in transactions, so a partition ends with a commit marker: a snapshot ending at the
    offset before it folds every event."""
    ends = await event_ends(ctx)
    snaps = snapshot_offsets(ctx)
    return all(snaps.get(p, -1) >= e - 1 for p, e in ends.items() if e > 0)


async def test_a_canary_is_found_nowhere_but_the_platforms_turns_before_and_after_erasure(canary, fake):
    run = Run(canary, fake)
    try:
        await run.write()  # nothing to look for without it: a failure here ends the test
    except BaseException:
        await run.close()
        raise
    try:
        for phase in (run.before_erasure, run.erase_member, run.after_erasure, run.remove_agent, run.compacted):
            try:
                await phase()
            except (AssertionError, MemlaneError, RuntimeError, httpx.HTTPError) as e:
                run.problems.append(f"{phase.__name__} failed: {type(e).__name__}: {e}")
                if "api" not in run.ctx.stack.procs:  # a scan had stopped it: start it for the next phase
                    run.ctx.stack.start("api")
                    await asyncio.to_thread(run.ctx.stack.wait_healthy, 60)
    finally:
        await run.close()
        await run.final()
        report = run.report()
        print("\n" + report)
    assert not run.problems, "\n".join(run.problems) + "\n\n" + report
