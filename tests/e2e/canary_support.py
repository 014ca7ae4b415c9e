"""Support for the canary test (tests/resilience/test_canary.py): a stack of its own, and readers of
every place memlane keeps bytes, each searched for a canary string.

Places, and how each is read so that no encoding hides plaintext:

- Kafka: every file of every partition directory of the stack's topics in the broker's log
  directory (segments, producer snapshots, and the `.deleted`/`.cleaned`/`.swap` files
  compaction leaves behind; not the offset and time indexes, which hold no record bytes),
  and every record of those topics read through a consumer (`read_uncommitted`: aborted
  transactions too; a compressed batch is decompressed there). `memlane.turns` is the
  platform's topic, the one place plaintext is allowed; its `.dlq` is memlane's and is
  searched.
- Redis: every key whose name holds the stack's topic prefix (its namespace `ml:<prefix>`,
  and any key that escaped it), by its `DUMP` and by a type-aware read of its values (RDB's
  LZF compression cannot hide a string there); the name of every other key of the server;
  and the append-only file's bytes written since the stack started (the persistence the
  local Redis uses: `--appendonly yes --save ""`), which keep what was written and deleted.
  No RDB dump is taken: `SAVE` blocks, and `BGSAVE` forks, a Redis other sessions share and
  that holds gigabytes on a dev machine; the reads above see every value an RDB would hold.
- Files: every file under the stack's data directory (Qdrant Edge shards and their
  checkpoints, ledger snapshots, the processes' log files) and the broker's and Redis's
  own logs written since the stack started; plus every Qdrant Edge point's payload read
  through the Edge bindings (payload pages are LZ4-compressed on disk).

A needle is searched case-insensitively (ASCII), raw and JSON-escaped. Findings name the
place (file and byte offset, topic/partition@offset and part, Redis key and field).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from services.stack import Stack
from workers.runtime.data_keys import ROLL_KEY

ROOT = Path(__file__).resolve().parents[2]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# ------------------------------------------------------------------------------ the canary


@dataclass(frozen=True)
class Canary:
    """A unique core (lowercase letters only: no digit run a PII rule could refuse) inside a
    phrase with a non-ASCII letter, so its JSON-escaped form differs from its UTF-8 one."""

    name: str
    core: str

    @classmethod
    def new(cls, name: str) -> Canary:
        return cls(name, "zq" + "".join(LETTERS[b % 26] for b in os.urandom(18)))

    @property
    def text(self) -> str:
        return f"Zoë-{self.core}"

    def needles(self) -> list[bytes]:
        """Lowercased byte forms: the core (in every other form), the phrase as UTF-8, and
        the phrase JSON-escaped (`\\u00eb`)."""
        forms = [self.core, self.text, json.dumps(self.text)[1:-1]]
        out: list[bytes] = []
        for f in forms:
            b = f.lower().encode()
            if b not in out:
                out.append(b)
        return out


@dataclass
class Finding:
    canary: str
    place: str  # kafka-segment, kafka-record, redis, redis-aof, file, qdrant-payload, log
    where: str
    context: str = ""

    def __str__(self) -> str:
        return f"[{self.canary}] {self.place}: {self.where}" + (f"  …{self.context}…" if self.context else "")


def hits(data: bytes, canaries: Iterable[Canary], most: int = 5) -> list[tuple[Canary, int, bytes]]:
    """(canary, offset, needle) of each occurrence of each canary in `data`, any case (at
    most `most` of each). The core is in every form of the phrase, so its occurrences are
    all of them; the other needles are looked for too, should a form ever lose the core."""
    low = data.lower()
    out = []
    for c in canaries:
        found = 0
        for n in c.needles():
            i = low.find(n)
            while i >= 0 and found < most:
                out.append((c, i, n))
                found += 1
                i = low.find(n, i + len(n))
            if found:
                break
    return out


def _context(data: bytes, at: int, needle: bytes, canary: Canary) -> str:
    """Bytes around a hit, printable, with the canary itself masked."""
    piece = data[max(0, at - 80): at + len(needle) + 40]
    text = piece.decode("utf-8", "replace")
    for n in canary.needles():
        text = re.sub(re.escape(n.decode()), "<CANARY>", text, flags=re.I)
    return re.sub(r"[^\x20-\x7e<>]", ".", text)


def find_in(data: bytes, canaries: Iterable[Canary], place: str, where: str) -> list[Finding]:
    return [Finding(c.name, place, f"{where} @byte {i}", _context(data, i, n, c)) for c, i, n in hits(data, canaries)]


# ------------------------------------------------------------------------------ the stack


class CanaryStack(Stack):
    """The pipeline and API, with the ledger snapshotting as often as its rule allows
    (`LedgerProcessor.snapshot_every = 1`: a partition is snapshotted once as many events
    as it has records were written since the last one, and at the end of every recovery),
    so ledger snapshots exist on disk to be searched."""

    def start(self, name: str) -> subprocess.Popen:
        if name != "ledger":
            return super().start(name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / "ledger.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "tests.e2e.canary_support", "ledger"], env=self.env,
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def stop_one(self, name: str, timeout: float = 30) -> None:
        """A graceful stop (SIGTERM): the API flushes its Edge shards, a worker its output."""
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise AssertionError(f"{name} did not stop within {timeout} s of SIGTERM") from None
        if p.returncode not in (0, -signal.SIGTERM):
            raise AssertionError(f"{name} exited with {p.returncode} on SIGTERM; see {self.log_dir / (name + '.log')}")


def broker_log_dir() -> Path | None:
    """The local broker's log directory (deploy/local/kafka.sh: `log.dirs` of its
    server.properties), or MEMLANE_KAFKA_LOG_DIR."""
    if os.environ.get("MEMLANE_KAFKA_LOG_DIR"):
        return Path(os.environ["MEMLANE_KAFKA_LOG_DIR"])
    run = Path(os.environ.get("MEMLANE_RUN_DIR") or ROOT / ".run")
    props = run / "kafka" / "server.properties"
    if not props.exists():
        return None
    for line in props.read_text().splitlines():
        if line.startswith("log.dirs="):
            return Path(line.split("=", 1)[1].split(",")[0])
    return None


def broker_logs() -> list[Path]:
    run = Path(os.environ.get("MEMLANE_RUN_DIR") or ROOT / ".run")
    return [p for p in (run / "kafka").glob("*.log")] + [p for p in (run / "redis").glob("*.log")]


# ------------------------------------------------------------------------------ files


class Tails:
    """Files written by shared processes (the broker's and Redis's logs, Redis's AOF): only
    what was appended after `mark` is this stack's."""

    def __init__(self) -> None:
        self.marks: dict[Path, int] = {}

    def mark(self, paths: Iterable[Path]) -> None:
        for p in paths:
            try:
                self.marks[p] = p.stat().st_size
            except OSError:
                pass

    def scan(self, paths: Iterable[Path], canaries: list[Canary], place: str) -> list[Finding]:
        out = []
        for p in paths:
            start = self.marks.get(p, 0)
            try:
                with open(p, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            for c, i, n in hits(data, canaries):
                out.append(Finding(c.name, place, f"{p} @byte {start + i}", _context(data, i, n, c)))
        return out


def scan_tree(root: Path, canaries: list[Canary], place: str, exclude: re.Pattern | None = None,
              only: re.Pattern | None = None) -> list[Finding]:
    out = []
    if not root.exists():
        return out
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if exclude is not None and exclude.search(rel):
                continue
            if only is not None and not only.search(rel):
                continue
            out += scan_file(p, canaries, place)
    return out


WINDOW = 8 << 20
_ZEROS = bytes(WINDOW)


def scan_file(path: Path, canaries: list[Canary], place: str) -> list[Finding]:
    """`find_in` over a file, window by window (overlapping by the longest needle), skipping
    windows of zeros: Kafka preallocates its index files and Qdrant its pages and vector
    chunks, hundreds of megabytes of nothing."""
    overlap = max(len(n) for c in canaries for n in c.needles())
    out: list[Finding] = []
    try:
        f = open(path, "rb")
    except OSError:
        return out  # removed meanwhile (a segment compaction deleted)
    with f:
        start = 0
        while True:
            f.seek(start)
            window = f.read(WINDOW + overlap)
            if not window:
                break
            if window != _ZEROS[:len(window)]:
                for c, i, n in hits(window, canaries):
                    if i < WINDOW or len(window) <= WINDOW:  # an overlap's hit is the next window's
                        out.append(Finding(c.name, place, f"{path} @byte {start + i}", _context(window, i, n, c)))
            if len(window) <= WINDOW:
                break
            start += WINDOW
    return out


def topic_dirs(log_dir: Path, prefix: str) -> list[Path]:
    """The partition directories of the stack's topics (`<topic>-<partition>`)."""
    return sorted(p for p in log_dir.iterdir() if p.is_dir() and p.name.startswith(prefix)
                  and re.fullmatch(r".+-\d+", p.name))


def is_turns_dir(path: Path, prefix: str) -> bool:
    return re.fullmatch(re.escape(prefix) + r"memlane\.turns-\d+", path.name) is not None


# A segment's offset and time indexes hold (offset, position) and (timestamp, offset) pairs,
# never a record's bytes, and are preallocated (10 MiB each per partition): not read.
INDEXES = re.compile(r"\.(time)?index(\.deleted|\.cleaned|\.swap)?$")


def scan_segments(log_dir: Path, prefix: str, canaries: list[Canary], turns: bool = False) -> list[Finding]:
    """Every file but the indexes of the stack's partition directories except
    `memlane.turns`' (or only those, with `turns`)."""
    out = []
    for d in topic_dirs(log_dir, prefix):
        if is_turns_dir(d, prefix) != turns:
            continue
        out += scan_tree(d, canaries, "kafka-segment", exclude=INDEXES)
    return out


# ------------------------------------------------------------------------------ Kafka records


async def read_all(bootstrap: str, topics: list[str]) -> list:
    """Every record of `topics` now on the broker, aborted transactions included."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    if not topics:
        return []
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    parts = sorted((TopicPartition(d["topic"], p["partition"]) for d in described if d["error_code"] == 0
                    for p in d["partitions"]), key=lambda tp: (tp.topic, tp.partition))
    if not parts:
        return []
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted", enable_auto_commit=False)
    await c.start()
    try:
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        end = await c.end_offsets(parts)
        out = []
        while pending := [tp for tp in parts if await c.position(tp) < end[tp]]:
            batches = await c.getmany(*pending, timeout_ms=500)
            for msgs in batches.values():
                out.extend(msgs)
        return out
    finally:
        await c.stop()


async def prefixed_topics(bootstrap: str, prefix: str) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return sorted(t for t in await admin.list_topics() if t.startswith(prefix))
    finally:
        await admin.close()


async def scan_records(bootstrap: str, prefix: str, canaries: list[Canary]) -> list[Finding]:
    """Keys, values and headers of every record of the stack's topics but `memlane.turns`."""
    topics = [t for t in await prefixed_topics(bootstrap, prefix) if t != f"{prefix}memlane.turns"]
    out = []
    for m in await read_all(bootstrap, topics):
        at = f"{m.topic}/{m.partition}@{m.offset}"
        out += find_in(m.key or b"", canaries, "kafka-record", f"{at} key")
        out += find_in(m.value or b"", canaries, "kafka-record", f"{at} value")
        for name, value in m.headers or ():
            out += find_in(name.encode() + b"=" + (value or b""), canaries, "kafka-record", f"{at} header {name}")
    return out


async def dlq_still_opens(settings, canary: Canary) -> list[str]:
    """Dead letters of `memlane.turns` (sealed whole, `Codec.park`) that the data keys
    the keys topic holds now still open to text holding the canary."""
    from events.sealing import KeyDestroyed
    from services.bootstrap import keys_at
    from workers.runtime.data_keys import open_keys

    msgs = await read_all(settings.kafka_bootstrap, [settings.topic("memlane.turns.dlq")])
    codec = keys_at(settings)()
    keys = await open_keys(settings, codec, follow=False)
    try:
        out = []
        for m in msgs:
            h = {k: v.decode() for k, v in m.headers or ()}
            where = "/".join(h.get(k, "") for k in ("source_topic", "source_partition", "source_offset"))
            try:
                plain = codec.unpark(m.value or b"", where)
            except KeyDestroyed:  # erased, as it should be; any other error is the test's to see
                continue
            if canary.core.encode() in plain.lower():
                out.append(f"{m.topic}/{m.partition}@{m.offset} (source {where})")
        return out
    finally:
        if keys is not None:
            await keys.stop()


@dataclass
class KeyEntry:
    subject: str
    kid: str
    wrapped: str | None  # base64 as the topic holds it; None once tombstoned


async def key_entries(bootstrap: str, topic: str) -> dict[str, KeyEntry]:
    """The keys topic as a reader folds it: kid -> its latest entry (a tombstone leaves wrapped None)."""
    out: dict[str, KeyEntry] = {}
    for m in await read_all(bootstrap, [topic]):
        if m.key == ROLL_KEY:
            continue  # the marker that closes a segment after an erasure: no key
        subject, _, kid = (m.key or b"").decode().rpartition("#")
        wrapped = json.loads(m.value)["wrapped"] if m.value is not None else None
        if wrapped is None and kid in out:
            out[kid].wrapped = None
        elif wrapped is not None:
            out[kid] = KeyEntry(subject, kid, wrapped)
        else:
            out[kid] = KeyEntry(subject, kid, None)
    return out


def key_material_on_disk(log_dir: Path, topic: str, wrapped: list[str], suffixes=(".log",)) -> list[str]:
    """Files of the keys topic's partition directory that still hold any of `wrapped`."""
    return bytes_on_disk(log_dir, topic, [w.encode() for w in wrapped] + [base64.b64decode(w) for w in wrapped],
                         suffixes)


def bytes_on_disk(log_dir: Path, topic: str, needles: list[bytes], suffixes=(".log",)) -> list[str]:
    """Files of the topic's partition 0 directory that hold any of `needles`."""
    out = []
    d = log_dir / f"{topic}-0"
    if not d.exists():
        return out
    for p in sorted(d.iterdir()):
        if not any(p.name.endswith(s) for s in suffixes):
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if any(n in data for n in needles):
            out.append(p.name)
    return out


# ------------------------------------------------------------------------------ Redis


async def scan_redis(url: str, root: str, prefix: str, canaries: list[Canary]) -> tuple[list[Finding], int]:
    """(findings, keys read): every key of the server whose name holds the stack's topic
    prefix (the namespace `root` = `ml:<prefix>`, and any key that escaped it), by its DUMP
    and a type-aware read of its values; of every other key, its name."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(url, decode_responses=False)
    out: list[Finding] = []
    n = 0
    try:
        async for key in r.scan_iter(count=10000):
            name = key.decode("utf-8", "replace")
            if prefix.encode() not in key:
                out += find_in(key, canaries, "redis", f"key name {name}")
                continue
            n += 1
            where = f"key {name}" + ("" if key.startswith(root.encode()) else f" (outside the namespace {root})")
            kind = (await r.type(key)).decode()
            parts: list[tuple[str, bytes]] = [("name", key)]
            dumped = await r.dump(key)
            if dumped:
                parts.append(("DUMP", dumped))
            if kind == "string":
                parts.append(("value", await r.get(key) or b""))
            elif kind == "hash":
                parts += [(f"field {f.decode('utf-8', 'replace')[:80]}", f + b"=" + v)
                          for f, v in (await r.hgetall(key)).items()]
            elif kind == "set":
                parts += [("member", v) for v in await r.smembers(key)]
            elif kind == "zset":
                parts += [("member", v) for v, _ in await r.zrange(key, 0, -1, withscores=True)]
            elif kind == "list":
                parts += [("item", v) for v in await r.lrange(key, 0, -1)]
            elif kind == "stream":
                for sid, fields in await r.xrange(key):
                    parts += [(f"entry {sid.decode()}", b" ".join(k + b"=" + v for k, v in fields.items()))]
            found = [f for what, data in parts for f in find_in(data, canaries, "redis", f"{where} ({kind}) {what}")]
            # What a value read finds is named by its field; the DUMP only when no read found it.
            read = {f.canary for f in found if " DUMP @" not in f.where}
            out += [f for f in found if " DUMP @" not in f.where or f.canary not in read]
    finally:
        await r.aclose()
    return out, n


async def records_after(bootstrap: str, topic: str, starts: dict[int, int]) -> int:
    """How many records of `topic` sit at or after `starts` (partition -> offset): a
    transaction's commit marker, which a consumer's committed offset stops before, is none."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted", enable_auto_commit=False)
    await c.start()
    try:
        parts = [TopicPartition(topic, p) for p in starts]
        end = await c.end_offsets(parts)
        parts = [tp for tp in parts if starts[tp.partition] < end[tp]]
        if not parts:
            return 0
        c.assign(parts)
        for tp in parts:
            c.seek(tp, starts[tp.partition])
        n = 0
        while pending := [tp for tp in parts if await c.position(tp) < end[tp]]:
            batches = await c.getmany(*pending, timeout_ms=500)
            n += sum(len(msgs) for msgs in batches.values())
        return n
    finally:
        await c.stop()


def drop_redis_keys(url: str, prefix: str) -> int:
    """Deletes every key whose name holds `prefix` (a finished canary stack's)."""
    import redis

    r = redis.Redis.from_url(url)
    try:
        keys = [k for k in r.scan_iter(count=10000) if prefix.encode() in k]
        for i in range(0, len(keys), 500):
            r.delete(*keys[i:i + 500])
        return len(keys)
    finally:
        r.close()


def redis_aof_files(url: str) -> list[Path]:
    """The append-only files of the Redis at `url`, when it keeps them on this machine."""
    import redis

    r = redis.Redis.from_url(url)
    try:
        if r.config_get("appendonly").get("appendonly") != "yes":
            return []
        d = Path(r.config_get("dir")["dir"]) / r.config_get("appenddirname").get("appenddirname", "appendonlydir")
    finally:
        r.close()
    # The incremental files only: a base file (an RDB after a rewrite) holds the data set as
    # it is, which the key scan reads already, and is gigabytes on a shared dev Redis.
    return sorted(d.glob("*.incr.aof")) if d.exists() else []


# ------------------------------------------------------------------------------ Qdrant


def dump_payloads(data_dir: Path) -> subprocess.CompletedProcess:
    """Every Edge shard's points with their payloads, as JSON lines, read by a child process
    (an Edge shard belongs to one process: call this while the API is stopped)."""
    return subprocess.run([sys.executable, "-m", "tests.e2e.canary_support", "payloads", str(data_dir)],
                          capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def scan_payloads(data_dir: Path, canaries: list[Canary]) -> tuple[list[Finding], int]:
    done = dump_payloads(data_dir)
    if done.returncode != 0:
        raise AssertionError(f"reading the Edge shards failed: {done.stderr.decode()[-2000:]}")
    out, n = [], 0
    for line in done.stdout.splitlines():
        row = json.loads(line)
        n += 1
        out += find_in(json.dumps(row["payload"], ensure_ascii=False).encode(), canaries, "qdrant-payload",
                       f"{row['shard']} point {row['id']}")
    return out, n


def _payloads_main(data_dir: str) -> None:
    from qdrant_edge import EdgeShard, ScrollRequest

    for cfg in sorted(Path(data_dir).rglob("edge_config.json")):
        shard_dir = cfg.parent
        shard = EdgeShard.load(str(shard_dir))
        try:
            offset = None
            while True:
                points, offset = shard.scroll(ScrollRequest(offset=offset, limit=256, with_payload=True,
                                                            with_vector=False))
                for p in points:
                    print(json.dumps({"shard": str(shard_dir.relative_to(data_dir)), "id": str(p.id),
                                      "payload": p.payload}, default=str))
                if offset is None:
                    break
        finally:
            shard.close()


# ------------------------------------------------------------------------------ phases


@dataclass
class Scan:
    """What one search of every place found, and how much it read (a place read empty is
    a blind search, not a clean one)."""

    phase: str
    findings: list[Finding] = field(default_factory=list)
    read: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    probes: set[str] = field(default_factory=set)  # the places the probe was found in
    took: dict[str, float] = field(default_factory=dict)  # seconds per place

    def outside_turns(self, canary: Canary) -> list[Finding]:
        return [f for f in self.findings if f.canary == canary.name and f.place != "kafka-turns"]

    def report(self) -> str:
        lines = [f"{self.phase} ({self.seconds:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in self.took.items())
                 + "; read: " + ", ".join(f"{k} {v}" for k, v in self.read.items()) + ")"]
        lines += [f"  {f}" for f in self.findings] or ["  (nothing found)"]
        return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "ledger":
        # The ledger worker, snapshotting as often as its rule allows.
        from workers.processors.ledger.processor import LedgerProcessor

        LedgerProcessor.snapshot_every = 1
        from services.cli import main

        sys.exit(main(["worker", "ledger"]))
    elif sys.argv[1] == "payloads":
        _payloads_main(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")

