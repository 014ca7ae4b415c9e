"""The pipeline's status for operators: workers, dead letters, the memory projection, the model
configuration and the last hour's activity, in one answer (GET /v1/admin/pipeline and the
Memory tab).

It answers when Kafka or Redis is slow: each part is bounded in time, and what could not be
read is `None` with a line in `errors`. The dead-letter offsets are read at most once a
second per process (as the health probe's), with a group-less consumer made for the read.
A dead letter's value may hold a member's data: it is never read out, and its headers (an
error text can quote its input) are shown only to the deployment's own operator key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from events.topics import TOPICS
from projections.embedders.port import MODEL_ID
from settings import Settings
from workers.runtime.kafka_io import reader

TIMEOUT_S = 3.0
CACHE_S = 1.0
PEEK = 5
# The dead-letter headers shown (workers.runtime.kafka_io.dlq_headers, and the runtime's consumer group).
DLQ_HEADERS = ("error", "source_topic", "source_partition", "source_offset", "attempt", "consumer_group")
_DEFAULT_PORTS = {"http": 80, "https": 443}

_cache: dict[tuple[str, str, bool], tuple[float, dict[str, Any], list[str]]] = {}
_locks: dict[tuple[str, str, bool], asyncio.Lock] = {}


async def pipeline_status(settings: Settings, health_probe: Any, shards: Any, activity: Any,
                          tenant: str | None, deployment: bool) -> dict[str, Any]:
    """`health_probe`: services.http.health_probe.HealthProbe; `shards`: the API's ShardOwner;
    `activity`: projections.redis.activity_view.ActivityView (None when not running). `tenant` scopes the
    activity chart (None: every tenant); `deployment` shows the dead letters' headers."""
    errors: list[str] = []
    workers, dlq, chart = await asyncio.gather(_workers(health_probe, errors), dead_letters(settings, deployment),
                                               _activity(activity, tenant, errors))
    dlq, dlq_errors = dlq
    return {
        "workers": workers,
        "dlq": dlq,
        "projection": {
            "generation": shards.generation,  # the one served
            "current_generation": shards.generations.current(),  # the one readers should use (a rebuild moves it)
            "status": shards.memory.status(),
        },
        "model": model_config(settings),
        "activity": chart,
        "errors": errors + dlq_errors,
    }


async def _workers(health_probe: Any, errors: list[str]) -> dict[str, Any]:
    # `assess` (services.http.health_probe) says the same, but services.http imports this
    # module: importing back would make the two a cycle.
    seen = await health_probe.observe()
    errors += seen.errors
    return {name: {"alive": beat is not None, "lag": seen.lags.get(name)} for name, beat in sorted(seen.beats.items())}


async def _activity(activity: Any, tenant: str | None, errors: list[str]) -> dict[str, Any] | None:
    if activity is None:
        errors.append("activity: the activity view is not running in this process")
        return None
    try:
        return await asyncio.wait_for(activity.series(tenant, None), TIMEOUT_S)
    except Exception as e:
        errors.append(f"activity: {type(e).__name__}; Redis may be unreachable")
        return None


def model_config(settings: Settings) -> dict[str, Any]:
    """The model settings without secrets: the base URL as scheme://host:port only (a URL may
    carry credentials in its user part, path or query)."""
    local = settings.embeddings == "local"
    return {
        "model": settings.model,
        "configured": settings.model_configured,
        "base_url": origin(settings.openai_base_url),
        "timeout_s": settings.model_timeout_s,
        "retries": settings.model_retries,
        "embeddings": {"provider": settings.embeddings, "model": MODEL_ID if local else settings.embedding_model},
    }


def origin(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    host = parts.hostname
    if not (parts.scheme and host):
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


async def dead_letters(settings: Settings, headers: bool) -> tuple[dict[str, Any], list[str]]:
    """Per dead-letter topic (by its registry name): `topic`, `size` (end minus beginning
    offset: a transactional writer's commit markers take offsets too, so an upper bound), and
    with `headers` its first `PEEK` messages' offset, time and headers. Cached `CACHE_S`."""
    key = (settings.kafka_bootstrap, settings.topic_prefix, headers)
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        hit = _cache.get(key)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1], hit[2]
        errors: list[str] = []
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
        c = reader(settings, max_poll_records=PEEK * len(TOPICS))
        try:
            out = await asyncio.wait_for(_read(admin, c, settings, headers), TIMEOUT_S)
            errors += [f"dlq: no topic {d['topic']} on the broker" for d in out.values() if d["size"] is None]
        except Exception as e:
            errors.append(f"dlq: {type(e).__name__} reading the dead-letter topics; Kafka may be slow or unreachable")
            out = {t.dlq: {"topic": settings.topic(t.dlq), "size": None} for t in TOPICS.values()}
        finally:
            for close in (c.stop, admin.close):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), TIMEOUT_S)
        _cache[key] = (time.monotonic(), out, errors)
        return out, errors


async def _read(admin: AIOKafkaAdminClient, c: Any, settings: Settings, headers: bool) -> dict[str, Any]:
    await admin.start()
    await c.start()
    names = {settings.topic(t.dlq): t.dlq for t in TOPICS.values()}
    # The partitions of each (ensure_topics makes one; an operator may have made more).
    tps = [TopicPartition(d["topic"], p["partition"]) for d in await admin.describe_topics(list(names))
           if d["topic"] in names and not d["error_code"] for p in d["partitions"]]
    begin = await c.beginning_offsets(tps) if tps else {}
    end = await c.end_offsets(tps) if tps else {}
    out: dict[str, Any] = {}
    for name, dlq in names.items():
        mine = [tp for tp in tps if tp.topic == name]
        out[dlq] = {"topic": name, "size": sum(max(0, end[tp] - begin[tp]) for tp in mine) if mine else None}
        if headers:
            out[dlq]["messages"] = []
    if headers:
        for tp, msgs in (await _peek(c, [tp for tp in tps if end[tp] > begin[tp]], end)).items():
            out[names[tp.topic]]["messages"] += [_letter(m) for m in msgs]
        for d in out.values():  # a topic of several partitions: its first PEEK of them all, by time
            d["messages"] = sorted(d["messages"], key=lambda m: m["timestamp"])[:PEEK]
    return out


async def _peek(c: Any, tps: list[TopicPartition], end: dict[TopicPartition, int]) -> dict[TopicPartition, list]:
    """The first `PEEK` messages of each of `tps` (fewer where it has fewer)."""
    got: dict[TopicPartition, list] = {tp: [] for tp in tps}
    if not tps:
        return got
    c.assign(tps)
    await c.seek_to_beginning(*tps)
    deadline = time.monotonic() + TIMEOUT_S / 2  # what was read by then, rather than nothing
    while time.monotonic() < deadline:
        open_ = [tp for tp in tps if len(got[tp]) < PEEK and await c.position(tp) < end[tp]]
        if not open_:
            break
        for tp, msgs in (await c.getmany(*open_, timeout_ms=500)).items():
            got[tp] += msgs[: PEEK - len(got[tp])]
    return got


def _letter(m: Any) -> dict[str, Any]:
    shown = {k: v.decode(errors="replace") for k, v in (m.headers or ()) if k in DLQ_HEADERS}
    return {"offset": m.offset, "timestamp": datetime.fromtimestamp(m.timestamp / 1000, UTC).isoformat(),
            "headers": shown}
