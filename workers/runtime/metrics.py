"""Every process's Prometheus metrics, defined once (docs/reference/metrics.md lists them with their ranges).

Labels hold bounded values only: worker and purpose names, decisions, error codes, topic
names and partition numbers. Never a tenant, an agent, a user, an id or a text: a label
value is kept by every scraper, outside memlane's erasure and retention.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

# Each process's metrics port: `metrics_port_base` + its index; MEMLANE_METRICS_PORT overrides, 0 turns it off.
PORT_INDEX = {"api": 0, "extraction": 1, "consolidation": 2, "ledger": 3, "embedding": 4, "redis-projection": 5,
              "history": 6}

# Seconds: from a cached Redis read (~1 ms) to a model call that times out (model_timeout_s, 30 s).
FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# ---------------------------------------------------------------- every worker (workers.runtime.runner)
CONSUMER_LAG = Gauge("memlane_consumer_lag", "Messages between a consumer's position and the end of its partition",
                     ["group", "topic", "partition"])
BATCH_SECONDS = Histogram("memlane_batch_seconds", "Time to process one poll's batch, before its commit",
                          ["worker"], buckets=FAST)
MESSAGES = Counter("memlane_messages_total", "Messages a worker processed", ["worker"])
DLQ_MESSAGES = Counter("memlane_dlq_messages_total", "Messages parked in a dead-letter topic", ["topic"])
READY = Gauge("memlane_ready", "1 when this process answers /ready with 200", ["process"])

# ---------------------------------------------------------------- model calls (workers.clients.model_client)
MODEL_SECONDS = Histogram("memlane_model_request_seconds", "One HTTP request to the chat model",
                          ["purpose", "outcome"], buckets=SLOW)
MODEL_TOKENS = Counter("memlane_model_tokens_total", "Tokens the model reported", ["purpose", "direction"])
MODEL_ERRORS = Counter("memlane_model_errors_total", "Failed model requests, by reason", ["purpose", "reason"])
MODEL_RETRIES = Counter("memlane_model_retries_total", "Model requests made again (transient error or repair)",
                        ["purpose", "why"])
MODEL_FAILED = Counter("memlane_model_failed_total", "Model calls given up after their retries", ["purpose"])

# ---------------------------------------------------------------- embeddings
EMBED_CALLS = Counter("memlane_embedding_calls_total", "Embedder calls (one batch each)", ["caller"])
EMBED_TEXTS = Counter("memlane_embedding_texts_total", "Texts embedded", ["caller"])
EMBED_SECONDS = Histogram("memlane_embedding_seconds", "One embedder call", ["caller"], buckets=FAST)

# ---------------------------------------------------------------- extraction and the ledger
EXTRACTION_DECISIONS = Counter("memlane_extraction_decisions_total",
                               "Review candidates: add, replace, delete, skip, or refused (with the reason)",
                               ["decision", "reason"])
LEDGER_COMMANDS = Counter("memlane_ledger_commands_total", "Commands the ledger decided, by type", ["command"])
LEDGER_REJECTIONS = Counter("memlane_ledger_rejections_total", "CommandRejected events, by error code", ["code"])

# ---------------------------------------------------------------- projections
EMBED_QUEUED = Gauge("memlane_embed_queued_texts", "Queries waiting to be embedded or being embedded, every tenant's")
PROJECTION_GENERATION = Gauge("memlane_projection_generation", "The generation a projection serves", ["projection"])
PROJECTION_POINTS = Gauge("memlane_projection_points", "Points in a Qdrant projection", ["projection"])
PROJECTION_CHECKPOINT_LAG = Gauge("memlane_projection_checkpoint_lag",
                                  "Messages between a projection's checkpoint and the end of the log", ["projection"])
PROJECTION_APPLIED = Counter("memlane_projection_applied_total", "Events a projection applied", ["projection"])

# ---------------------------------------------------------------- reads (services.memory.reads)
SEARCH_SECONDS = Histogram("memlane_search_seconds", "One memory search, embedding included", buckets=FAST)
RECALL_SECONDS = Histogram("memlane_recall_seconds", "One recall, embedding included", buckets=FAST)

# ---------------------------------------------------------------- scheduled jobs (docs/operations/scheduled-jobs.md)
SWEEPS = Counter("memlane_sweeps_total", "Scheduled expiry sweeps the ledger ran (workers.processors.ledger.processor)")
SWEEP_RECORDS = Counter("memlane_sweep_records_total", "Expired records a scheduled sweep named")
RECORDS_EXPIRED = Counter("memlane_records_expired_total",
                          "RecordExpired events the ledger decided (scheduled, nightly or `memlane sweep`)")
OPTIMIZE_RUNS = Counter("memlane_index_optimize_runs_total",
                        "Background optimised generations the API process built, by outcome", ["outcome"])
OPTIMIZE_CHECKS = Counter("memlane_index_optimize_checks_total",
                          "Looks the API process took at whether an optimised generation is due")
OPTIMIZE_LAST_SECONDS = Gauge("memlane_index_optimize_last_seconds", "How long the last optimised generation took")
UNINDEXED_POINTS = Gauge("memlane_index_unindexed_points",
                         "Points of a memory shard whose dense vector is in no HNSW graph", ["shard"])


def model_request(purpose: str, seconds: float, error: str | None, tokens_in: int, tokens_out: int) -> None:
    """One request to the model: its latency by outcome, and the tokens it reported."""
    outcome = "ok" if error is None else "malformed" if error.startswith("malformed") else "error"
    MODEL_SECONDS.labels(purpose, outcome).observe(seconds)
    if tokens_in:
        MODEL_TOKENS.labels(purpose, "in").inc(tokens_in)
    if tokens_out:
        MODEL_TOKENS.labels(purpose, "out").inc(tokens_out)


def model_error_reason(e: Exception) -> str:
    """A bounded name for a failed request (never the message, which may quote the prompt)."""
    import openai

    if isinstance(e, openai.RateLimitError):
        return "rate_limited"
    if isinstance(e, openai.APITimeoutError):
        return "timeout"
    if isinstance(e, openai.APIConnectionError):
        return "connection"
    if isinstance(e, openai.APIStatusError):
        return "server_error" if e.status_code >= 500 else "client_error"
    return "other"


def extraction_decided(decided: Any) -> None:
    """A review's candidates (`events.rules.extraction_review.Decided`) by decision."""
    for cmd in decided.commands:
        if type(cmd).__name__ == "DeleteMemory":
            decision = "delete"
        else:
            decision = "replace" if getattr(cmd, "replaces", None) else "add"
        EXTRACTION_DECISIONS.labels(decision, "").inc()
    if decided.skipped:
        EXTRACTION_DECISIONS.labels("skip", "").inc(decided.skipped)
    for r in decided.refused:
        EXTRACTION_DECISIONS.labels("refused", r.reason).inc()


class Timed:
    """`with Timed(histogram):` observes the block's duration."""

    def __init__(self, histogram: Any) -> None:
        self.histogram = histogram

    def __enter__(self) -> Timed:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.histogram.observe(time.perf_counter() - self.t0)


class MeteredEmbedder:
    """An embedder that counts its calls and texts (`caller`: which process role asked)."""

    def __init__(self, inner: Any, caller: str) -> None:
        self.inner, self.caller = inner, caller

    def embed(self, texts: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            if texts:  # an empty batch asks no model
                EMBED_CALLS.labels(self.caller).inc()
                EMBED_TEXTS.labels(self.caller).inc(len(texts))
                EMBED_SECONDS.labels(self.caller).observe(time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
