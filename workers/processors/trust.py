"""The trust worker: folds `Retrieved` on `memlane.usage` (which records reached the model in
a search or a recall) into one `RecordUsage` command per agent and batch, for the ledger,
which adds the counts to the records' `usage_count` without a new version (docs/features/trust.md).

Transactional: a batch's commands and its input offsets commit together, so a crash sends a
batch's counts again only if they never went out. A command is named after the span of usage
offsets it counts, and the ledger counts a span once (its mark per agent and usage partition),
so a redelivered command never counts twice either.

It runs inside the ledger's process (`services.bootstrap.COMPANIONS`), in a consumer group of its
own: the work is a few dictionary updates per batch, not worth a process and a deployment.
"""

from __future__ import annotations

from typing import Any

from events.codec import Codec
from events.rules.trust import UsageSpan, fold_usage, usage_commands
from events.topics import COMMANDS, USAGE
from workers.runtime.runner import Out, Processor


class TrustProcessor(Processor):
    name = "trust"
    sources = (USAGE.name,)
    transactional = True
    # A second's retrievals in one command per agent: each is a ledger transaction, and a
    # retrieval's count is a ranking signal no reader waits for.
    gather_ms = 1000

    def __init__(self, settings, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        # The batch being read: (tenant, agent) -> its spans. Emptied by `batch_done`, which
        # the runner calls after each partition's batch, before its offsets commit.
        self.spans: dict[tuple[str, str], list[UsageSpan]] = {}
        self.sent = 0

    async def process(self, source: str, partition: int, offset: int, value: Any) -> list[Out]:
        fold_usage(self.spans, partition, offset, value)
        return []

    async def batch_done(self) -> list[Out]:
        commands, self.spans = usage_commands(self.spans), {}
        self.sent += len(commands)
        return [Out(COMMANDS.name, COMMANDS.key_bytes(c), self.codec.encode(c)) for c in commands]

    async def revoked(self, partitions: set) -> None:
        # The runner commits what was processed before a revocation; nothing is left half-read.
        self.spans = {}
