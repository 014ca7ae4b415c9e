"""`memlane status` and `memlane dlq list|show|replay`: the operator's view of a deployment
and its dead letters, from the shell (docs/reference/cli.md).

Both read Kafka and Redis directly, with the same code as `GET /v1/admin/pipeline` and
`/health` (services.pipeline_status, services.http.health_probe): an operator reaches for them
when something is wrong, which is when the API may be down too, and they then need no key.
`status` asks the API only for its `/health`, to say whether it is up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, cast

from settings import Settings, get_settings
from settings.logging import configure

LIST_LIMIT = 50


# ---------------------------------------------------------------------------------- status


async def gather_status(settings: Settings) -> dict[str, Any]:
    """What `memlane status --json` prints."""
    from events.codec import PLAIN
    from events.topics import TOPICS
    from services.bootstrap import redis_at
    from services.http.health_probe import HealthProbe, assess
    from services.pipeline_status import model_config
    from workers.runtime.dlq import DeadLetters

    redis = redis_at(settings)
    r = redis(decode_responses=False, socket_timeout=5)
    probe = HealthProbe(settings, redis, client=r)
    try:
        seen, (dlq, dlq_errors), projection, api, processes = await asyncio.gather(
            probe.observe(), _dead_letters(DeadLetters(settings, r, PLAIN), [t.dlq for t in TOPICS.values()]),
            _projection(settings, r), _api(settings), _processes(settings))
        workers, problems = assess(seen, settings.health_max_lag, {})
        for name, beat in seen.beats.items():
            if beat:
                workers[name].update(group=beat.get("group"), topics=beat.get("topics"),
                                     beat_age_s=round(time.time() - beat["at"], 1) if "at" in beat else None)
    finally:
        await probe.close()
        await r.aclose()
    not_ready = problems + dlq_errors + projection.pop("errors")
    not_ready += [f"{name} /ready: {reason}" for name, p in processes.items() if p["status"] == "not_ready"
                  for reason in p["reasons"] or ["not ready"]]
    if not api["reachable"]:
        not_ready.append(f"api: not reachable at {settings.api_url}; start `memlane serve`")
    elif api["status"] != "ok":
        not_ready.append(f"api: /health says {api['status']}: " + "; ".join(api.get("problems") or []))
    return {
        "at": datetime.now(UTC).isoformat(),
        "deployment": {"topic_prefix": settings.topic_prefix, "kafka": settings.kafka_bootstrap,
                       "redis": _redis_origin(settings.redis_url), "max_lag": settings.health_max_lag},
        "ready": not not_ready,
        "not_ready": not_ready,
        "workers": workers,
        "dlq": dlq,
        "projection": projection,
        "model": model_config(settings),
        "api": api,
        "processes": processes,
    }


async def _dead_letters(d: Any, dlqs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Sizes and replayed counts per dead-letter topic. Not `pipeline_status.dead_letters`:
    describing a topic that does not exist makes the broker create it, and a status with a
    mistyped MEMLANE_TOPIC_PREFIX must not make a deployment's worth of topics."""
    try:
        out = await asyncio.wait_for(d.sizes(dlqs), 10)
    except Exception as e:
        return ({name: {"topic": d.settings.topic(name), "size": None} for name in dlqs},
                [f"dlq: {type(e).__name__} reading the dead-letter topics; Kafka or Redis may be unreachable"])
    return out, [f"dlq: no topic {x['topic']} on the broker" for x in out.values() if x["size"] is None]


def _redis_origin(url: str) -> str | None:
    from services.pipeline_status import origin

    return origin(url)  # never a password in the URL's user part


async def _projection(settings: Settings, r: Any) -> dict[str, Any]:
    """The Redis record view's generation (the one readers use) and those kept; the Qdrant
    generation the API serves from (its data directory: this host's), with when it was made
    current. A rebuild keeps the previous generation of each."""
    from services.bootstrap import index_generations

    errors: list[str] = []
    out: dict[str, Any] = {"redis": None, "qdrant": None}
    root = f"{settings.redis_root}"
    try:
        g, kept = await asyncio.wait_for(asyncio.gather(r.get(f"{root}generation"), r.smembers(f"{root}generations")), 5)
        out["redis"] = {"generation": int(g) if g else 1, "generations": sorted(int(x) for x in kept)}
    except Exception as e:
        errors.append(f"projection: {type(e).__name__} reading the Redis generation; Redis may be unreachable")
    generations = index_generations(settings)
    gen = generations.current()
    current, path = generations.root / "CURRENT", generations.root / f"memory-g{gen}"
    made = current if current.exists() else path if path.exists() else None
    since = made.stat().st_mtime if made is not None else None
    out["qdrant"] = {"generation": gen, "path": str(path), "exists": path.exists(),
                     "since": datetime.fromtimestamp(since, UTC).isoformat() if since else None,
                     "age_s": round(time.time() - since) if since else None}
    return {**out, "errors": errors}


async def _api(settings: Settings) -> dict[str, Any]:
    import httpx

    try:
        async with httpx.AsyncClient(base_url=settings.api_url, timeout=3) as h:
            body = (await h.get("/health")).json()
        return {"url": settings.api_url, "reachable": True, "status": body.get("status"),
                "problems": body.get("problems") or []}
    except Exception:
        return {"url": settings.api_url, "reachable": False, "status": None, "problems": []}


async def _processes(settings: Settings) -> dict[str, Any]:
    """Each process's own `/ready` on its metrics port (workers.runtime.probe), on this host: `status`
    None when nothing answers there (not on this host, another port, or metrics off), which
    the heartbeats above already judge. An answer from another kind of process at that port
    is not taken."""
    try:
        from workers.runtime import metrics
        from workers.runtime.probe import metrics_port
    except ImportError:  # a deployment without per-process probes
        return {}
    import httpx

    async def one(h: httpx.AsyncClient, name: str) -> tuple[str, dict[str, Any]]:
        port = metrics_port(settings, name)
        out: dict[str, Any] = {"port": port, "status": None, "reasons": []}
        if not port:
            return name, out
        try:
            body = (await h.get(f"http://{settings.metrics_host}:{port}/ready")).json()
        except Exception:
            return name, out
        if body.get("process") == name:
            out.update(status=body.get("status"), reasons=body.get("reasons") or [])
        return name, out

    async with httpx.AsyncClient(timeout=2) as h:
        return dict(await asyncio.gather(*(one(h, n) for n in metrics.PORT_INDEX)))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


def _count(text: str) -> int:
    """--limit: 0 or more messages (0: all)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--limit: a whole number of messages, 0 or more, got {text!r}")
    return int(text)


def _table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def render_status(st: dict[str, Any]) -> str:
    d = st["deployment"]
    out = [f"memlane status at {st['at']}  (topic prefix {d['topic_prefix'] or '(none)'!r}, kafka {d['kafka']}, "
           f"redis {d['redis']})", ""]
    rows = [[name, "alive" if w["alive"] else "DEAD", "-" if w["lag"] is None else w["lag"], _age(w.get("beat_age_s")),
             w.get("group") or "-"] for name, w in st["workers"].items()]
    out += [f"Workers (lag bound {d['max_lag']})",
            _table(rows, ["worker", "state", "lag", "last beat", "consumer group"]) if rows else "(no worker registered)",
            ""]
    rows = [[x["topic"], "?" if x["size"] is None else x["size"], x.get("replayed", "?")]
            for _, x in sorted(st["dlq"].items())]
    out += ["Dead letters (`memlane dlq list TOPIC`)", _table(rows, ["topic", "size", "replayed"]), ""]
    p = st["projection"]
    rows = []
    if p["redis"]:
        kept = p["redis"]["generations"]
        rows.append(["redis record view", p["redis"]["generation"],
                     (",".join(map(str, kept[-4:])) + (f" (+{len(kept) - 4} older)" if len(kept) > 4 else "")) or "-",
                     "- (not recorded)"])
    q = p["qdrant"]
    rows.append(["qdrant memory index", q["generation"], "-" if q["exists"] else "(not on this host)", _age(q["age_s"])])
    out += ["Projections", _table(rows, ["projection", "generation", "kept", "age"]), ""]
    m = st["model"]
    out += ["Model",
            f"  model {m['model']} ({'configured' if m['configured'] else 'NOT configured: no reviews'}), "
            f"base url {m['base_url'] or '(OpenAI default)'}, timeout {m['timeout_s']} s, retries {m['retries']}",
            f"  embeddings {m['embeddings']['provider']}: {m['embeddings']['model']}", ""]
    a = st["api"]
    out += [f"API {a['url']}: " + (a["status"] if a["reachable"] else "not reachable"), ""]
    rows = [[name, p["port"] or "-", p["status"] or "no answer", "; ".join(p["reasons"])[:100]]
            for name, p in st.get("processes", {}).items()]
    if rows:
        out += ["Processes' /ready (metrics ports on this host)",
                _table(rows, ["process", "port", "ready", "reasons"]), ""]
    if st["ready"]:
        out.append("Ready: nothing is wrong.")
    else:
        out += ["Not ready:", *(f"  - {x}" for x in st["not_ready"])]
    return "\n".join(out)


def cmd_status(args: argparse.Namespace) -> int:
    settings = get_settings()
    configure("WARNING", service="cli")
    st = asyncio.run(gather_status(settings))
    print(json.dumps(st, indent=2) if args.json else render_status(st))
    return 0 if st["ready"] else 1


# ---------------------------------------------------------------------------------- dlq


def _ref(spec: str) -> tuple[int, int]:
    """'17' (partition 0) or '2:17'."""
    part, _, off = spec.rpartition(":")
    try:
        return int(part or 0), int(off)
    except ValueError:
        raise SystemExit(f"memlane dlq: an offset looks like 17 or 0:17, not {spec!r}") from None


def _letter_row(x: Any) -> list[str]:
    h = x.headers
    state = ("replayed -> " + x.replayed.get("to", "(sending)")) if x.replayed else "-"
    return [x.ref, x.timestamp[:19], f"{h.get('source_topic', '?')}/{h.get('source_partition', '?')}/"
            f"{h.get('source_offset', '?')}", h.get("attempt", "-"), h.get("consumer_group", "-"),
            f"repeat {x.repeat}" if x.repeat else "-", state, (h.get("error") or "")[:80]]


async def _with_letters(settings: Settings, fn) -> Any:
    from services.bootstrap import keys_at, redis_at
    from workers.runtime.dlq import DeadLetters
    from workers.runtime.kafka_io import wait_for_broker

    await wait_for_broker(settings, timeout=30)
    r = redis_at(settings)(decode_responses=False)
    try:
        return await fn(DeadLetters(settings, r, keys_at(settings)()))
    finally:
        await r.aclose()


def cmd_dlq(args: argparse.Namespace) -> int:
    from events.topics import TOPICS
    from workers.runtime.dlq import dlq_name

    settings = get_settings()
    configure("WARNING", service="cli")
    try:
        dlq = dlq_name(args.topic, settings) if getattr(args, "topic", None) else None
    except ValueError as e:
        print(f"memlane dlq: {e}", file=sys.stderr)
        return 2
    if args.action == "list":
        return _dlq_list(args, settings, [dlq] if dlq else [t.dlq for t in TOPICS.values()])
    # `show` and `replay` take a topic (argparse requires one), so they have a dead-letter topic.
    if args.action == "show":
        return _dlq_show(args, settings, cast(str, dlq))
    return _dlq_replay(args, settings, cast(str, dlq))


def _dlq_list(args: argparse.Namespace, settings: Settings, dlqs: list[str]) -> int:
    async def go(d):
        sizes = await d.sizes(dlqs)
        return {name: (sizes[name], await d.letters(name)) for name in dlqs}

    got = asyncio.run(_with_letters(settings, go))
    if args.json:
        print(json.dumps({name: {**size, "messages": [x.view() for x in letters]}
                          for name, (size, letters) in got.items()}, indent=2))
        return 0
    for size, letters in got.values():
        shown = letters[-args.limit:] if args.limit else letters
        print(f"{size['topic']}: " + ("no such topic" if size["size"] is None else f"{size['size']} messages, "
              f"{size['replayed']} replayed") + (f" (the last {len(shown)} shown)" if len(shown) < len(letters) else ""))
        if shown:
            print(_table([_letter_row(x) for x in shown],
                         ["offset", "time", "source", "attempt", "consumer group", "repeat", "replay", "error"]))
        print()
    return 0


def _dlq_show(args: argparse.Namespace, settings: Settings, dlq: str) -> int:
    partition, offset = _ref(args.offset)
    x = asyncio.run(_with_letters(settings, lambda d: d.letter(dlq, partition, offset, keep_value=args.value)))
    if x is None:
        print(f"memlane dlq show: no message at {settings.topic(dlq)} {partition}:{offset}", file=sys.stderr)
        return 1
    view = x.view(value=args.value)
    view["headers"] = x.headers  # every header of this one message (never the value, unless --value)
    if args.value and x.value is not None:
        view["value"] = _opened_value(settings, x)
    print(json.dumps(view, indent=2))
    return 0


def _opened_value(settings: Settings, x: Any) -> str:
    """The dead letter's value as the worker saw it: a turn memlane parked sealed is opened
    with the deployment's keys (or said to be sealed when they cannot open it)."""
    from services.bootstrap import keys_at
    from workers.runtime.data_keys import install_keys

    h = x.headers
    where = f"{h.get('source_topic')}/{h.get('source_partition')}/{h.get('source_offset')}"
    codec = keys_at(settings)()

    async def go() -> str:
        await install_keys(settings, codec)
        try:
            return codec.unpark(x.value, where).decode(errors="replace")
        except Exception as e:
            return f"(sealed; cannot open it here: {type(e).__name__})"

    return asyncio.run(go())


def _dlq_replay(args: argparse.Namespace, settings: Settings, dlq: str) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from workers.runtime.data_keys import install_keys

    if not args.all and not args.offset:
        print("memlane dlq replay: name the dead letters (--offset N, repeatable) or --all", file=sys.stderr)
        return 2

    async def go(d) -> int:
        if (why := d.replayable(dlq)) is not None:
            print(f"memlane dlq replay: {settings.topic(dlq)} is not replayed: {why}", file=sys.stderr)
            return 2
        letters = await d.letters(dlq, keep_value=True)
        if args.offset:
            wanted = {_ref(o) for o in args.offset}
            chosen = [x for x in letters if (x.partition, x.offset) in wanted]
            missing = wanted - {(x.partition, x.offset) for x in chosen}
            if missing:
                print("memlane dlq replay: no dead letter at " + ", ".join(f"{p}:{o}" for p, o in sorted(missing)),
                      file=sys.stderr)
                return 1
        else:
            chosen = letters
        done = [x for x in chosen if x.replayed]
        todo = [x for x in chosen if not x.replayed]
        if done:
            print(f"{len(done)} replayed already, not sent again: {', '.join(x.ref for x in done[:20])}"
                  + (" ..." if len(done) > 20 else ""))
        if not todo:
            print(f"nothing to replay from {settings.topic(dlq)}")
            return 0
        if not args.yes:
            if not sys.stdin.isatty():
                print(f"memlane dlq replay: would send {len(todo)} dead letters back to their source topic; "
                      "pass --yes to do it", file=sys.stderr)
                return 2
            answer = input(f"send {len(todo)} dead letters of {settings.topic(dlq)} back to their source topic? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing sent")
                return 1
        if any(x.value and x.value.startswith(b'{"parked"') for x in todo):
            await install_keys(settings, d.codec)  # parked turns are opened before they go back
        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       disable=len(todo) < 10)
        task = bar.add_task("replaying", total=len(todo))
        with bar:
            results = await d.replay(dlq, todo, lambda n, total: bar.update(task, completed=n))
        sent = [x for x in results if "sent" in x]
        for x in results:
            print(f"{x['ref']} -> {x['sent']} (replay {x['count']})" if "sent" in x else f"{x['ref']}: skipped, {x['skipped']}")
        print(f"replayed {len(sent)} of {len(todo)} dead letters from {settings.topic(dlq)}; one that fails again "
              "returns to the DLQ marked as a repeat, and is not sent again on its own")
        return 0 if len(sent) == len(todo) else 1

    return asyncio.run(_with_letters(settings, go))


# ---------------------------------------------------------------------------------- arguments


def add_parsers(sub: Any) -> None:
    """`status` and `dlq` on the `memlane` parser's subcommands."""
    st = sub.add_parser("status", help="workers' lag, dead letters, projection generations, model configuration "
                        "and what is not ready, read from Kafka and Redis (no API needed); exit 1 when not ready")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(fn=cmd_status)

    d = sub.add_parser("dlq", help="dead-letter topics: list, show one message's headers, replay to the source topic")
    dsub = d.add_subparsers(dest="action", required=True)
    dl = dsub.add_parser("list", help="each <topic>.dlq with its size and messages (never their values)")
    dl.add_argument("topic", nargs="?", default=None, help="one topic, e.g. memlane.turns.dlq (default: all)")
    dl.add_argument("--limit", type=_count, default=LIST_LIMIT, help=f"messages shown per topic, newest (default "
                    f"{LIST_LIMIT}; 0: all)")
    dl.add_argument("--json", action="store_true", help="machine-readable output, every message")
    ds = dsub.add_parser("show", help="one dead letter's headers")
    ds.add_argument("topic")
    ds.add_argument("offset", help="17, or PARTITION:OFFSET")
    ds.add_argument("--value", action="store_true", help="also print its value (a member's data: ask for it only "
                    "when you must)")
    dr = dsub.add_parser("replay", help="send dead letters back to their source topic, once each")
    dr.add_argument("topic")
    dr.add_argument("--offset", action="append", default=[], help="a dead letter to replay (17 or 0:17); repeatable")
    dr.add_argument("--all", action="store_true", help="every dead letter of the topic not replayed yet")
    dr.add_argument("--yes", action="store_true", help="do not ask")
    for p in (dl, ds, dr):
        p.set_defaults(fn=cmd_dlq)
