"""Helpers shared by benchmarks: figure output, a private stack, progress."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from services.stack import Stack, free_port, stack_env
from settings import ROOT, Settings
from workers.runtime.kafka_io import delete_prefixed_topics


def figure(name: str, value: float, unit: str, n: int, **extra) -> None:
    print(json.dumps({"figure": name, "value": round(value, 3), "unit": unit, "n": n, "cores": os.cpu_count(), **extra}),
          flush=True)


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


@contextmanager
def bench_stack(name: str, api: bool = True, workers: tuple[str, ...] | None = None, keep: bool = False,
                env: dict[str, str] | None = None):
    """A private stack; `keep` reuses one deployment (topics, Redis keys, index) across runs;
    `env`: more of its processes' environment (e.g. MEMLANE_ENCRYPTION=0)."""
    run_id = f"bench{name}" if keep else f"bench{name}{uuid.uuid4().hex[:6]}"
    data = ROOT / ".run" / run_id
    port = free_port()
    settings = Settings(topic_prefix=f"{run_id}.", data_dir=data, api_port=port)
    env = stack_env(MEMLANE_TOPIC_PREFIX=settings.topic_prefix, MEMLANE_DATA_DIR=str(data), MEMLANE_API_PORT=str(port),
                    **(env or {}))
    stack = Stack(env, Path(data) / "logs")
    t0 = time.monotonic()
    try:
        stack.start_all(api=api, **({"workers": workers} if workers is not None else {}))
        progress(f"stack up in {time.monotonic() - t0:.1f} s (logs: {stack.log_dir})")
        yield stack, settings
    finally:
        stack.stop()
    if not keep:
        discard(settings)


def discard(settings: Settings) -> None:
    """Delete a finished run's topics and files: each run leaves hundreds of MB behind.
    Only after a run that succeeded: a failed one keeps its logs to read."""

    with ThreadPoolExecutor(1) as pool:  # callable from inside a running event loop too
        pool.submit(asyncio.run, delete_prefixed_topics(settings, settings.topic_prefix)).result()
    if Path(settings.data_dir).name.startswith("bench"):  # never a deployment's own directory
        shutil.rmtree(settings.data_dir, ignore_errors=True)
    progress(f"discarded {settings.topic_prefix}* topics and {settings.data_dir}")


CACHE = Path(tempfile.gettempdir()) / "memlane-tune-history"  # the tuning harnesses' vectors


def embedded(texts: list[str]) -> np.ndarray:
    CACHE.mkdir(exist_ok=True)
    path = CACHE / (hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16] + ".npy")
    if not path.exists():
        from projections.embedders.onnx import OnnxMiniLM

        progress(f"embedding {len(texts)} texts (cached in {CACHE})")
        np.save(path, np.array(OnnxMiniLM().embed(texts), dtype=np.float32))
    return np.load(path)
