"""The composition root: where settings become adapters and processors.

Every process builds its processors here and hands them, through their constructors, the
deployment's Redis (`RedisAt`), the process's codec (`KeysAt`: the keyring that seals and opens
personal fields), where the memory index's generations live (`index_generations`), and their
embedders and ways to make the model's and the API's clients. Nothing below this module opens a
Redis connection from a URL, makes a keyring, chooses an index adapter or reads the environment.
Kafka clients are the one exception by design: the runtime makes and remakes them (a rejoin, a
producer renewed after a failed send) from the settings passed down. Test stacks build through
the same functions."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from events.codec import Codec
from settings import Settings

if TYPE_CHECKING:
    from projections.qdrant.generations import IndexGenerations

# Connections one process opens at most (per node on a cluster). On one server a burst of
# requests beyond it waits for a free connection (up to POOL_WAIT_S) instead of failing with
# "Too many connections"; redis-py's cluster client has no waiting pool, so it gets more.
POOL_SIZE = 128
POOL_WAIT_S = 20.0
CLUSTER_POOL_SIZE = 1024


@dataclass(frozen=True)
class RedisAt:
    """The deployment's Redis (`projections.redis.connection.Connect`): a URL, and whether it names
    a node of a cluster. A value, so a rebuild's child processes get it pickled."""

    url: str
    cluster: bool = False

    def __call__(self, *, pooled: bool = False, decode_responses: bool = True, **kwargs: Any) -> Any:
        import redis.asyncio as aioredis
        from redis.asyncio.cluster import RedisCluster
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError, TimeoutError

        retry = {"retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 5),
                 "retry_on_error": [ConnectionError, TimeoutError]} if pooled else {}
        if self.cluster:
            return RedisCluster.from_url(self.url, decode_responses=decode_responses, max_connections=CLUSTER_POOL_SIZE,
                                         **retry, **kwargs)
        if not pooled:
            return aioredis.from_url(self.url, decode_responses=decode_responses, **kwargs)
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=POOL_SIZE, timeout=POOL_WAIT_S, decode_responses=decode_responses, **retry,
            **kwargs)
        return aioredis.Redis.from_pool(pool)


def redis_at(settings: Settings) -> RedisAt:
    return RedisAt(settings.redis_url, settings.redis_cluster)


@dataclass(frozen=True)
class KeysAt:
    """The deployment's data keys: the local key provider's master-key file, None with encryption
    off. A value, so a rebuild's child processes get it pickled. Called once per process: its
    runners, followers and views share that one codec, so a key one of them learns all know."""

    key_file: Path | None

    def __call__(self) -> Codec:
        if self.key_file is None:
            return Codec()
        from projections.keys import Keyring, LocalKeyFile

        return Codec(Keyring(LocalKeyFile.create(self.key_file)))


def keys_at(settings: Settings) -> KeysAt:
    return KeysAt(settings.key_file if settings.encryption else None)


def index_generations(settings: Settings) -> IndexGenerations:
    """Where the memory index's generations live: a Qdrant server's (or local mode's) collections,
    or the embedded Edge shards in the data directory."""
    from projections.qdrant.generations import EdgeGenerations, ServerGenerations

    root = Path(settings.data_dir) / "qdrant"
    if settings.qdrant_client_mode:
        return ServerGenerations(root, settings.memory_shards, settings.qdrant_url, settings.qdrant_collection_prefix,
                                 settings.qdrant_local_path, settings.qdrant_api_key, settings.embedding_dim)
    return EdgeGenerations(root, settings.memory_shards)


# The stream processors `memlane worker NAME` runs, and the processors that run inside another
# worker's process in consumer groups of their own. The run-compression worker is rare work of
# the same kind as consolidation (one model call), usage counts and tenant convention candidates
# are a few dict updates per batch for the ledger, and session history's vectors use the
# embedding worker's model in a group of their own, so a turn's parts never hold up the vector
# of a record search waits for.
PROCESSORS = {
    "extraction": "workers.processors.extraction.processor:ExtractionProcessor",
    "consolidation": "workers.processors.consolidation:ConsolidationProcessor",
    "ledger": "workers.processors.ledger.processor:LedgerProcessor",
    "embedding": "workers.processors.embedding:EmbeddingProcessor",
    "redis-projection": "workers.processors.redis_projection:RedisProjectionProcessor",
    "history": "workers.processors.history_projection:HistoryProcessor",
    "run-compression": "workers.processors.run_compression:RunCompressionProcessor",
    "trust": "workers.processors.trust:TrustProcessor",
    "conventions": "workers.processors.conventions:ConventionsProcessor",
    "history-embedding": "workers.processors.history_embedding:HistoryEmbeddingProcessor",
}
WORKERS = ("extraction", "consolidation", "ledger", "embedding", "redis-projection", "history")
COMPANIONS = {"consolidation": ("run-compression",), "ledger": ("trust", "conventions"),
              "embedding": ("history-embedding",)}
# The processors that read or write Redis get the deployment's `RedisAt`; those that embed, the
# process's embedder.
USE_REDIS = {"extraction", "consolidation", "redis-projection", "history", "run-compression", "conventions"}
USE_EMBEDDER = {"embedding", "history-embedding"}
# Those that call the model get a way to make its client, and those that read the agent's
# configuration and similar memories through the API, the API's reader: both made in the
# processor's own event loop, when it starts.
USE_MODEL = {"extraction", "consolidation", "run-compression"}
USE_API = {"extraction", "consolidation"}


def processor_class(name: str) -> Any:
    """The class of processor `name`, imported only when asked for: a worker's process loads
    only its own processors' dependencies."""
    if name not in PROCESSORS:
        raise ValueError(f"worker: {name!r} is not one of {', '.join(WORKERS)}")
    module, _, cls = PROCESSORS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


class ProcessAdapters:
    """The adapters of one process's processors: the deployment's Redis, the process's codec and
    tracing, an embedder each, and the model's and the API's clients.
    The embedding worker and its history companion keep a model session each, so a turn's long
    parts never queue a record's vector behind them in one session's thread pool."""

    def __init__(self, settings: Settings, service: str = "worker") -> None:
        self.settings = settings
        self.redis = redis_at(settings)
        self.codec = keys_at(settings)()
        self.tracing = tracing(settings, service)

    def embedder(self) -> Any:
        from projections.embedders.choose import make_embedder

        # No cache of its own: a worker caches vectors per subject (workers.processors.embedding).
        return make_embedder(self.settings, cache_size=0)

    def model(self) -> Any:
        from workers.clients.model_client import ModelClient

        return ModelClient(self.settings)

    def api(self) -> Any:
        from workers.clients.api_reader import ApiReader

        return ApiReader(self.settings)


def build_processor(name: str, adapters: ProcessAdapters) -> Any:
    """The processor `name` (a worker of `WORKERS` or a companion), with its adapters."""
    cls, settings = processor_class(name), adapters.settings
    made: dict[str, Any] = {"codec": adapters.codec}
    if name in USE_MODEL:
        made["model"] = adapters.model
    if name in USE_API:
        made["api"] = adapters.api
    if name in USE_REDIS:
        return cls(settings, adapters.redis, **made)
    if name in USE_EMBEDDER:
        return cls(settings, adapters.embedder(), **made)
    return cls(settings, **made)


def tracing(settings: Settings, service: str) -> Any:
    """The process's tracing (`workers.runtime.tracing`): off unless an OTLP endpoint is set."""
    from workers.runtime.tracing import NO_TRACING, OtelTracing

    if not settings.otlp_endpoint:
        return NO_TRACING
    try:
        return OtelTracing(f"memlane-{service}", settings.otlp_endpoint, settings.trace_sample_ratio,
                           settings.trace_export_delay_ms)
    except ImportError as e:
        raise SystemExit(f"OTEL_EXPORTER_OTLP_ENDPOINT is set but {e.name} is not installed: install "
                         "memlane with the tracing extra (pip install 'memlane[tracing]'), or unset it") from None
