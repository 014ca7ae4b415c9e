"""The `memlane` command: start workers, serve the API, replay, rebuild, issue keys, demo."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from functools import partial
from typing import cast

from services.bootstrap import (
    COMPANIONS,
    WORKERS,
    ProcessAdapters,
    build_processor,
    index_generations,
    keys_at,
    redis_at,
)
from services.cli_clients import add_parsers as client_parsers
from services.cli_portable import add_parsers as portable_parsers
from services.cli_shadow import add_parsers as shadow_parsers
from services.cli_undo import add_parsers as undo_parsers
from services.cli_webhooks import add_parsers as webhook_parsers
from services.stack import ALL  # `memlane worker all`: every worker in one process (test and demo stacks)
from settings import get_settings
from settings.logging import configure


def _refuse_default_operator_key(settings, what: str) -> int | None:
    """Outside development mode, the operator key every checkout shares must not open a
    deployment: exit 2 with what to do. In development, start with a warning."""
    if not settings.default_operator_key:
        return None
    if not settings.dev:
        print(f"memlane {what}: MEMLANE_OPERATOR_KEY is the default development key, which anyone can read in "
              "the source; set a secret one, or MEMLANE_DEV=1 for local development", file=sys.stderr)
        return 2
    import structlog

    structlog.get_logger().warning("default_operator_key", hint="development mode (MEMLANE_DEV): set a secret "
                                   "MEMLANE_OPERATOR_KEY before this deployment holds real data")
    return None


def cmd_worker(args: argparse.Namespace) -> int:
    import uvloop

    from workers.runtime.heap import tune_for_service

    settings = get_settings()
    names = list(WORKERS) if args.name == ALL else [args.name]
    configure(settings.log_level, service=f"worker.{args.name}")
    if args.deregister:
        from workers.runtime.heartbeat import deregister

        for name in names:
            asyncio.run(deregister(settings, redis_at(settings), name))
            print(f"worker {name}: deregistered; /health no longer expects it")
        return 0
    if (refused := _refuse_default_operator_key(settings, f"worker {args.name}")) is not None:
        return refused
    adapters = ProcessAdapters(settings, f"worker-{args.name}")
    processors = {name: build_processor(name, adapters) for name in names}
    tune_for_service()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: [p.stopping.set() for p in processors.values()])
        await asyncio.gather(*(_run_worker(name, p, adapters) for name, p in processors.items()))

    # uvloop: a worker is one event loop moving small messages between sockets, and
    # asyncio's pure-Python loop and transports were a visible share of its CPU.
    try:
        uvloop.run(run())
    finally:
        adapters.tracing.shutdown()
    return 0


async def _run_worker(name: str, processor, adapters: ProcessAdapters) -> None:
    """One worker as its own process runs it: its runner (own consumer group, own transactional
    producer), heartbeat, probe and companions. `worker all` runs each of them in one loop."""
    from workers.runtime.heartbeat import heartbeat
    from workers.runtime.probe import WorkerProbe
    from workers.runtime.runner import Runner

    settings = adapters.settings
    runner = Runner(processor, settings, tracing=adapters.tracing)
    # The heartbeat /health reads names the group the runner consumes in. The probe serves
    # the worker's /metrics, /health and /ready on its own port (docs/reference/metrics.md).
    async with heartbeat(settings, adapters.redis, name, runner.group, list(processor.sources)):
        await WorkerProbe(runner, name).serve(settings, _with_companions(name, processor, adapters, runner.run()))


async def _with_companions(name: str, processor, adapters: ProcessAdapters, main) -> None:
    """`main` (the worker's runner), and a runner for each companion processor. They share the
    worker's stop signal: one loop may hold only one handler per signal."""
    from workers.runtime.runner import Runner

    runners = []
    for companion_name in COMPANIONS.get(name, ()):
        companion = build_processor(companion_name, adapters)
        companion.stopping = processor.stopping
        runners.append(Runner(companion, adapters.settings, tracing=adapters.tracing).run())
    await asyncio.gather(main, *runners)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.http import build_app
    from services.web.pages import WebExtension
    from workers.runtime.heap import tune_for_service

    settings = get_settings()
    configure(settings.log_level, service="api")
    if (refused := _refuse_default_operator_key(settings, "serve")) is not None:
        return refused
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    app = build_app(settings, extra=[WebExtension()])
    tune_for_service()
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False,
                forwarded_allow_ips=settings.forwarded_allow_ips)
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from workers.runtime.kafka_io import ensure_topics, wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")

    async def go():
        await wait_for_broker(settings)
        await ensure_topics(settings)

    asyncio.run(go())
    return 0


def _progress_bars(labels: list[str]):
    """One bar per label; `update(label, done, total)` moves it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), transient=False)
    tasks = {label: bar.add_task(label, total=None) for label in labels}
    return bar, lambda label, done, total: bar.update(tasks[label], completed=done, total=total)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from events.topics import EVENTS, VECTORS
    from workers.jobs.rebuild import rebuild_all
    from workers.runtime.kafka_io import require_topics, wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")
    switch = not args.no_switch
    after = {
        "redis": "" if not switch else " and switched to",
        "qdrant": "" if not switch else "; memlane serve switches to it",
    }

    async def go():
        await wait_for_broker(settings)
        await require_topics(settings, [EVENTS, VECTORS])
        targets = ("redis", "qdrant") if args.target == "all" else (args.target,)
        bar, updates = _progress_bars(list(targets))
        with bar:
            gens = await rebuild_all(settings, redis_at(settings), index_generations(settings), keys_at(settings), updates,
                                     switch=switch,
                                     optimize=args.optimize, targets=targets)
        for target, gen in gens.items():
            print(f"{target}: generation {gen} built{after[target]}")

    asyncio.run(go())
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from projections.keys import LocalKeyFile

    settings = get_settings()
    existed = settings.key_file.exists()
    provider = LocalKeyFile.create(settings.key_file)
    state = "exists" if existed else "created"
    print(f"key file {settings.key_file} {state} (KEK version {provider.current}); keep it out of version "
          "control and back it up apart from the data: without it nothing sealed can be read")
    return 0


def cmd_kek(args: argparse.Namespace) -> int:
    """KEK rotation: `rotate` adds a master key and wraps every data key again under it (the log's
    ciphertexts stay as they are); `retire` wraps again what is still under older versions and
    drops them, once every process was restarted on the new file (docs/features/encryption-and-erasure.md)."""
    from projections.keys import LocalKeyFile
    from workers.runtime.data_keys import KeyTopic, open_keys
    from workers.runtime.kafka_io import wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")
    provider = LocalKeyFile.create(settings.key_file)
    old = [v for v in provider.versions if v != provider.current]
    if args.action == "rotate":
        print(f"KEK version {provider.rotate()} is current; wrapping every data key under it")

    async def go() -> int:
        await wait_for_broker(settings)
        # A cast, not an assert: with encryption off this fails on None as it always did.
        keys = cast(KeyTopic, await open_keys(settings, keys_at(settings)(), follow=False))
        keys.keyring.provider = provider
        bar, updates = _progress_bars(["data keys"])
        try:
            with bar:
                return await keys.rewrap(partial(updates, "data keys"))
        finally:
            await keys.stop()

    n = asyncio.run(go())
    print(f"{n} data keys wrapped again under KEK version {provider.current}")
    if args.action == "retire":
        for v in old:
            provider.retire(v)
        print(f"retired KEK versions {', '.join(old) or '(none)'}; {settings.key_file} holds version {provider.current}")
    else:
        print("restart every memlane process, then run `memlane kek retire` to drop the old versions")
    return 0


def _offsets(spec: str | None) -> dict[int, int] | None:
    """'0=10,3=200' -> {0: 10, 3: 200}; a bare number applies to every partition."""
    if not spec:
        return None
    from events.topics import EVENTS

    if spec.isdigit():
        return {p: int(spec) for p in range(EVENTS.partitions)}
    try:
        return {int(p): int(o) for p, o in (part.split("=") for part in spec.split(","))}
    except ValueError:
        raise SystemExit(f"memlane replay: offsets must look like '1200' or '0=10,3=200', not {spec!r}") from None


def cmd_replay(args: argparse.Namespace) -> int:
    from events.topics import EVENTS, VECTORS
    from workers.jobs.rebuild import replay_qdrant, replay_redis
    from workers.runtime.kafka_io import require_topics, wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")
    codec = keys_at(settings)()
    replay = partial(replay_redis, settings, redis_at(settings), codec) if args.target == "redis" else partial(
        replay_qdrant, settings, index_generations(settings), codec)

    async def go():
        await wait_for_broker(settings)
        await require_topics(settings, [EVENTS, VECTORS])
        label = f"replay into {args.target} generation {args.generation}"
        bar, updates = _progress_bars([label])
        with bar:
            n = await replay(args.generation, _offsets(args.from_offset), _offsets(args.to_offset),
                             partial(updates, label))
        print(f"replayed {n} events into {args.target} generation {args.generation}")

    try:
        asyncio.run(go())
    except ValueError as e:
        print(f"memlane replay: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from datetime import datetime

    from events.base import utcnow
    from workers.jobs.sweep import sweep
    from workers.runtime.kafka_io import wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")
    try:
        at = datetime.fromisoformat(args.at) if args.at else utcnow()
    except ValueError:
        print(f"memlane sweep: --at must be an ISO 8601 time such as 2026-12-01T00:00:00+00:00, not {args.at!r}",
              file=sys.stderr)
        return 2
    if at.tzinfo is None:
        print("memlane sweep: --at needs a time zone, such as +00:00", file=sys.stderr)
        return 2

    async def go():
        await wait_for_broker(settings)
        bar, updates = _progress_bars(["expired records"])
        with bar:
            n = await sweep(settings, redis_at(settings), at, partial(updates, "expired records"))
        print(f"sent expiry sweeps as of {at.isoformat()} naming {n} records; the ledger tombstones them")

    asyncio.run(go())
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Every worker and the API as supervised child processes (services/supervisor.py)."""
    from services.supervisor import run_from_args

    settings = get_settings()
    if (refused := _refuse_default_operator_key(settings, "start")) is not None:
        return refused
    return run_from_args(args, settings)


def cmd_demo(args: argparse.Namespace) -> int:
    from services.demo import run_demo

    return run_demo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memlane", description="Event-sourced long-term memory for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run one stream worker (scale each on its own)")
    w.add_argument("name", choices=[*sorted(WORKERS), ALL],
                   help="which worker to run (all: every worker in this one process, each in its own consumer group)")
    w.add_argument("--deregister", action="store_true",
                   help="do not run it: tell /health this worker is stopped for good (killed, not restarted)")
    w.set_defaults(fn=cmd_worker)

    s = sub.add_parser("serve", help="serve the HTTP API and the Qdrant projection of its shard")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.set_defaults(fn=cmd_serve)

    t = sub.add_parser("topics", help="create memlane's topics (workers also do this on start)")
    t.set_defaults(fn=cmd_topics)

    r = sub.add_parser("rebuild", help="build new projection generations from the log, then switch over")
    r.add_argument("--target", choices=["redis", "qdrant", "all"], default="all")
    r.add_argument("--no-switch", action="store_true", help="build but leave readers on the current generation")
    r.add_argument("--optimize", action="store_true", help="build the Qdrant HNSW index before switching (slow, faster search)")
    r.set_defaults(fn=cmd_rebuild)

    rp = sub.add_parser("replay", help="replay a range of event offsets into a named projection generation")
    rp.add_argument("--target", choices=["redis", "qdrant"], default="redis")
    rp.add_argument("--generation", type=int, required=True, help="target generation number")
    rp.add_argument("--from-offset", default=None, help="first offset, e.g. 1200 or 0=10,3=200 (default: start)")
    rp.add_argument("--to-offset", default=None, help="offset to stop before (default: the end)")
    rp.set_defaults(fn=cmd_replay)

    sw = sub.add_parser("sweep", help="tombstone expired records of every agent (run nightly)")
    sw.add_argument("--at", default=None, help="sweep as of this ISO 8601 time (default: now)")
    sw.set_defaults(fn=cmd_sweep)

    client_parsers(sub)  # `mcp`, `keys`
    portable_parsers(sub)  # `export`, `import`
    undo_parsers(sub)  # `undo`
    shadow_parsers(sub)  # `shadow`
    webhook_parsers(sub)  # `webhooks deliver`

    from services.operator_cli import add_parsers as operator_parsers

    operator_parsers(sub)  # `status`, `dlq list|show|replay`

    i = sub.add_parser("init", help="create the local key file data keys are wrapped under (processes also "
                       "create it on first start)")
    i.set_defaults(fn=cmd_init)

    kk = sub.add_parser("kek", help="rotate the key-encryption key: wrap every data key again, log untouched")
    kk.add_argument("action", choices=["rotate", "retire"],
                    help="rotate: new KEK version, rewrap; retire: rewrap stragglers, drop older versions")
    kk.set_defaults(fn=cmd_kek)

    from services.supervisor import add_arguments as start_arguments

    st = sub.add_parser("start", help="run every worker and the API as supervised processes: restarts with "
                        "backoff, a log per process, readiness, a clean stop on SIGTERM/Ctrl-C")
    start_arguments(st)
    st.set_defaults(fn=cmd_start)

    d = sub.add_parser("demo", help="start everything, store a sample conversation, search it, stop")
    d.set_defaults(fn=cmd_demo)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        print(f"memlane: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
