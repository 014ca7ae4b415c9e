"""One settings object for every process (environment prefix `MEMLANE_`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parent.parent
# The bootstrap operator key every fresh checkout shares: `memlane serve` and the workers
# refuse it unless MEMLANE_DEV says this is a development deployment.
DEFAULT_OPERATOR_KEY = "memlane-local-operator-key"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMLANE_", extra="ignore")

    kafka_port: int = 39092
    kafka_bootstrap: str = ""
    redis_port: int = 36379
    # REDIS_URL (no prefix: the name Redis hosts and tools set) wins; MEMLANE_REDIS_URL works too.
    redis_url: str = Field(default="", validation_alias="REDIS_URL")
    # REDIS_URL names a node of a Redis Cluster: every process connects with redis-py's
    # cluster client (projections.redis.connection; docs/operations/redis-cluster.md).
    redis_cluster: bool = False
    data_dir: Path = ROOT / ".run" / "data"
    # The memory index on a Qdrant server or cluster through qdrant-client (docs/operations/qdrant-server.md):
    # QDRANT_URL (no prefix, the name Qdrant's tools use) wins; MEMLANE_QDRANT_URL works too, and
    # QDRANT_API_KEY likewise. Unset: the embedded Qdrant Edge shards in the data directory.
    # MEMLANE_QDRANT_LOCAL_PATH instead runs qdrant-client's local mode in that directory: a
    # protocol check where no server is reachable, not for production.
    qdrant_url: str = Field(default="", validation_alias="QDRANT_URL")
    qdrant_api_key: str = Field(default="", validation_alias="QDRANT_API_KEY")
    qdrant_local_path: Path | None = None
    # Collection and alias names start with this (default: "memlane." and the topic prefix,
    # so deployments and test stacks sharing a server keep apart).
    qdrant_collection_prefix: str = ""
    api_host: str = "127.0.0.1"
    api_port: int = 38080
    # Proxies whose X-Forwarded-Proto/-For the API believes (comma-separated IPs, or *): behind a
    # TLS-terminating load balancer, name it, so the web page sees https (its Origin check and
    # its cookie's Secure flag depend on it).
    forwarded_allow_ips: str = "127.0.0.1"
    api_url: str = ""
    # Worker topics get this prefix so tests can run isolated pipelines on one broker.
    topic_prefix: str = ""
    # Replicas of every topic memlane creates (DLQs and memlane.keys included), and its
    # min.insync.replicas (unset: the broker's default). 1 suits the local single broker; on a
    # cluster 3 and 2 keep every acknowledged write through one broker's death
    # (docs/operations/kafka-replication.md). Existing topics keep what they were created with.
    topic_replication_factor: int = Field(default=1, ge=1)
    topic_min_insync_replicas: int | None = Field(default=None, ge=1)
    # A transactional worker killed mid-transaction leaves it open, and every read_committed
    # reader of its partitions waits until the broker aborts it after this long (Kafka's
    # default, 60 s, stalled the pipeline that long). Each transaction here only sends a
    # batch's outputs and offsets, so seconds are plenty.
    transaction_timeout_ms: int = Field(default=10_000, ge=1_000, le=900_000)
    # This process's name among its worker's replicas, set by whatever starts it (`memlane
    # start` gives each child one): the same across its restarts and never shared by two live
    # processes, so a restart's transactional producer fences its dead predecessor at once.
    # Unset: a random transactional id each start (docs/operations/kafka-replication.md).
    worker_instance: str = ""
    group_prefix: str = "memlane"
    log_level: str = "INFO"
    # Bootstrap operator key: issues agent keys. Set a secret one outside local development.
    operator_key: str = DEFAULT_OPERATOR_KEY
    # Development mode (`make up`, `make demo`, `make test` and test stacks set it): the
    # default operator key is accepted, with a warning at start.
    dev: bool = False
    openai_api_key: str = Field(default="", validation_alias="OPENAI_API_KEY")
    openai_base_url: str = Field(default="", validation_alias="OPENAI_BASE_URL")
    model: str = "gpt-4o-mini"
    # Model calls (extraction): per-call timeout, retries after the first call, backoff base.
    model_timeout_s: float = 30.0
    model_retries: int = 3
    model_backoff_s: float = 0.5
    # Embeddings: "local" (ONNX MiniLM, offline) or "openai" (/v1/embeddings at OPENAI_BASE_URL).
    embeddings: str = "local"
    embedding_model: str = "text-embedding-3-small"
    # The Qdrant collection is 384-dimensional; served models are asked for this many dimensions.
    embedding_dim: int = 384
    # How long the extraction worker trusts an agent's configuration read from the API.
    config_cache_s: float = 2.0
    turn_timeout_s: float = 600.0
    # The memory index is split by agent into this many Edge shards (each takes its share
    # of the 8 event partitions), so a rebuild folds them in parallel processes. A
    # generation keeps the count it was built with: a new count takes effect with the next
    # `memlane rebuild qdrant`.
    memory_shards: int = Field(default=2, ge=1, le=8)
    # The deployment's kill switch: 1, true, on or enabled turn memory off for every
    # agent (agents' memory calls refused, nothing recalled, no reviews); any other value,
    # unreadable ones included, leaves memory on.
    memory_kill_switch: bool = Field(default=False, validation_alias="AGENT_MEMORY_KILL_SWITCH")
    # /health: each worker writes a heartbeat this often, kept this long; a worker without
    # one is dead. A consumer group further behind than health_max_lag messages is lagging.
    heartbeat_s: float = Field(default=2.0, gt=0)
    # The API's query embedding (docs/features/fairness.md): this many embedder calls at once, taken from
    # each tenant's queue in turn; a tenant with tenant_queued_texts queries waiting gets 429.
    embed_slots: int = Field(default=2, ge=1, le=64)
    # Threads of the local embedder in each process (0: onnxruntime's choice, every core). Test
    # and bench stacks run one, as many processes share their machine's cores.
    embed_threads: int = Field(default=0, ge=0, le=64)
    tenant_queued_texts: int = Field(default=256, ge=1)
    heartbeat_ttl_s: float = Field(default=10.0, gt=0)
    # A registered worker without a heartbeat for this long was stopped for good (killed
    # and not restarted): /health forgets it instead of reporting it dead forever.
    worker_forget_s: float = Field(default=3600.0, gt=0)
    health_max_lag: int = Field(default=10_000, ge=0)
    # The serving process compares the record view with the memory index this often and
    # heals what differs (`workers.followers.reconciler`); 0 turns the periodic pass off.
    reconcile_every_s: float = Field(default=300.0, ge=0)
    # The first pass waits this long after the shards catch up: a process just started (or
    # just swapped generations) serves its first requests while parked records join their
    # vectors on their own, and a pass then would only compete with both.
    reconcile_delay_s: float = Field(default=60.0, ge=0)
    # Envelope encryption (docs/features/encryption-and-erasure.md): the local key provider's master-key file,
    # made on first start (or by `memlane init`) and never committed. Off only for the
    # benches that measure what encryption costs.
    key_file: Path = ROOT / ".run" / "keys" / "memlane.key"
    encryption: bool = True
    # memlane.keys rolls a segment this often: a destroyed key is physically gone within
    # about twice this (docs/features/encryption-and-erasure.md).
    keys_segment_ms: int = Field(default=3_600_000, ge=100)
    # Retention (docs/features/encryption-and-erasure.md): the ledger's nightly pass at this UTC hour,
    # then every retention_every_s; at most retention_cap records per subject a night.
    retention_hour_utc: int = Field(default=3, ge=0, le=23)
    retention_every_s: float = Field(default=86_400.0, gt=0)
    retention_cap: int = Field(default=500, ge=1)
    # /metrics, /health and /ready of each process (docs/reference/metrics.md): on this port, unset the
    # process's default (metrics_port_base + its index in docs/reference/metrics.md's table), 0 none.
    # Gauges such as consumer lag are sampled every metrics_every_s.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_port_base: int = Field(default=39100, ge=1, le=65000)
    metrics_host: str = "127.0.0.1"
    metrics_every_s: float = Field(default=5.0, gt=0)
    # Traces (docs/operations/tracing.md): off unless an OTLP/HTTP endpoint is set, under the
    # standard OpenTelemetry names. A trace is kept for this share of turns and requests that
    # arrive without one (a caller's sampled trace is always followed); spans leave in batches
    # this often.
    otlp_endpoint: str = Field(default="", validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0, validation_alias="OTEL_TRACES_SAMPLER_ARG")
    trace_export_delay_ms: int = Field(default=5000, ge=10, le=600_000, validation_alias="OTEL_BSP_SCHEDULE_DELAY")
    # Scheduled jobs (docs/operations/scheduled-jobs.md). The ledger sweeps its partitions' expired records
    # this often (0: only the nightly retention pass and `memlane sweep` do).
    sweep_every_s: float = Field(default=3600.0, ge=0)
    # The API process builds an optimised memory generation in the background once a shard has
    # this many more unindexed points than its last optimise left (0: never); looked at every
    # optimize_check_s, one process at a time (a Redis lock held for at most optimize_lock_s).
    optimize_unindexed_points: int = Field(default=20_000, ge=0)
    optimize_check_s: float = Field(default=60.0, gt=0)
    optimize_lock_s: float = Field(default=3600.0, gt=0)
    # Crash tests only: a named point where the process kills itself (workers.runtime.faults).
    fault_at: str | None = None
    # Crash tests only: seconds between an erasure's commit and its keys' destruction.
    ledger_erasure_delay_s: float = Field(default=0.0, ge=0)

    @field_validator("memory_kill_switch", mode="before")
    @classmethod
    def _switch(cls, v: object) -> bool:
        return str(v).strip().lower() in {"1", "true", "on", "enabled"}

    @model_validator(mode="after")
    def _replicas(self) -> Settings:
        # More in-sync replicas than replicas would make every acks=all write fail.
        if (self.topic_min_insync_replicas or 0) > self.topic_replication_factor:
            raise ValueError(f"MEMLANE_TOPIC_MIN_INSYNC_REPLICAS ({self.topic_min_insync_replicas}) exceeds "
                             f"MEMLANE_TOPIC_REPLICATION_FACTOR ({self.topic_replication_factor})")
        return self

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        if not self.kafka_bootstrap:
            self.kafka_bootstrap = f"127.0.0.1:{self.kafka_port}"
        if not self.redis_url:
            import os

            self.redis_url = os.environ.get("MEMLANE_REDIS_URL") or f"redis://127.0.0.1:{self.redis_port}/0"
        if not self.api_url:
            self.api_url = f"http://{self.api_host}:{self.api_port}"
        if not self.qdrant_url or not self.qdrant_api_key:
            import os

            self.qdrant_url = self.qdrant_url or os.environ.get("MEMLANE_QDRANT_URL", "")
            self.qdrant_api_key = self.qdrant_api_key or os.environ.get("MEMLANE_QDRANT_API_KEY", "")
        if not self.qdrant_collection_prefix:
            self.qdrant_collection_prefix = f"memlane.{self.topic_prefix}"
        return self

    @property
    def qdrant_client_mode(self) -> bool:
        """Whether the memory index is a Qdrant server's (or local mode's) rather than Edge's."""
        return bool(self.qdrant_url or self.qdrant_local_path)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    @property
    def redis_root(self) -> str:
        """Where this deployment's Redis keys start: with no topic prefix, `ml:` as before."""
        return f"ml:{self.topic_prefix}"

    @property
    def default_operator_key(self) -> bool:
        return self.operator_key == DEFAULT_OPERATOR_KEY

    @property
    def model_configured(self) -> bool:
        return bool(self.openai_api_key or self.openai_base_url)


@lru_cache
def get_settings() -> Settings:
    return Settings()
