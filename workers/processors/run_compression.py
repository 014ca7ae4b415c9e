"""Compresses a run's session memory once its buffer passes its size (docs/features/session-memory.md).

It reads `memlane.memory.events` in its own consumer group and acts on `RunEntryAdded` events
whose counts of entries not yet summarized pass `events.rules.runs.needs_compression`: the
ledger put those counts on the event, so this worker keeps no state. It reads the run from the
run view (once the redis-projection worker shows the entry), makes one model call (purpose
`consolidation`) over the previous summary and the older entries, and sends `SummarizeRun` to
the ledger, which records `RunSummarized`; usage records go in the same transaction as the
input offset. A model that keeps failing sends the event to the DLQ. It runs inside the
`memlane worker consolidation` process (`services.cli`), beside the consolidation processor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from events.codec import Codec
from events.rules import runs as rules
from events.rules import write_filter
from events.topics import COMMANDS, EVENTS, USAGE
from events.usage import CandidateRefused
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from projections.redis.run_view import RunView
from workers.clients.model_client import CallContext, ModelClient, ModelFailed
from workers.runtime.runner import DeadLetter, Out, Processor, until_folded
from workers.runtime.topic_reader import checkpoint_key

log = structlog.get_logger()
ANSWER_SCHEMA = rules.answer_schema()
VIEW_WAIT_S = 30.0  # how long a trigger waits for the run view to show its entry before a retry


class RunCompressionProcessor(Processor):
    name = "run-compression"
    sources = (EVENTS.name,)
    transactional = True
    concurrent_keys = True  # agents compress independently; each waits on its own model call

    def __init__(self, settings, redis: Connect, *, codec: Codec, model: Callable[[], ModelClient]) -> None:
        super().__init__(settings, codec=codec)
        self.redis = redis
        self.make_model = model  # made in `start`, in the worker's event loop
        self.model: ModelClient | None = None
        self.records: RedisRecords | None = None
        self.runs: RunView | None = None
        self.tally: Counter[str] = Counter()

    async def start(self) -> None:
        s = self.settings
        if s.memory_kill_switch or not s.model_configured:
            log.warning("run_compression_off", reason="no model configured, or the memory kill switch is set; "
                        "run buffers are not compressed")
            return
        self.model = self.make_model()
        self.records = RedisRecords(self.redis(pooled=True), namespace=s.topic_prefix, keys=self.keys,
                                    codec=self.codec)
        self.runs = RunView(self.records)

    async def stop(self) -> None:
        for closer in (self.model and self.model.close, self.records and self.records.aclose):
            if closer:
                await closer()

    def decode(self, source: str, data: bytes) -> Any:
        # Only run entries matter: the rest of the log is skipped without being decoded.
        return super().decode(source, data) if b'"RunEntryAdded"' in data else None

    async def process(self, source: str, partition: int, offset: int, e: Any) -> list[Any]:
        if e is None or e.type != "RunEntryAdded" or self.model is None:
            return []
        if not rules.needs_compression(e.pending_entries, e.pending_chars):
            return []
        assert self.runs is not None
        entries, previous = await self._shown(partition, offset, e)
        if not rules.needs_compression(len(entries), sum(x.chars for x in entries)):
            self.tally["already_summarized"] += 1  # a summary landed since this entry
            return []
        older = rules.to_compress(entries)
        if not older:
            return []
        ctx = dict(agent=e.agent, run=e.run, entries=len(older), offset=offset)
        call = CallContext(e.tenant, e.agent, None, None, None, f"run:{e.event_id}")
        try:
            answer = await self.model.json_call(rules.build_messages(e.run, previous, older), ANSWER_SCHEMA,
                                                rules.parse_answer, call, purpose="consolidation")
        except ModelFailed as err:
            log.error("run_compression_failed_dead_lettered", error=err.error, attempts=err.attempts, **ctx)
            self.tally["dead_lettered"] += 1
            return [self._usage(u) for u in err.usage] + [DeadLetter(f"run compression: {err.error}", err.attempts)]
        used = [self._usage(u) for u in answer.usage]
        if hit := write_filter.check_write(answer.value.summary):
            # A summary the model writes passes the write-time filter like any write: refused, the
            # entries stay as they are, and the next entry asks again.
            log.warning("run_summary_refused", reason=hit.refusal.reason, **ctx)
            self.tally["summaries_refused"] += 1
            return used + [self._usage(CandidateRefused(
                usage_id=f"run-refused-{e.event_id}", tenant=e.tenant, agent=e.agent, occurred_at=e.occurred_at,
                reason=f"{hit.refusal.reason}: {hit.refusal.detail} (run summary)"))]
        cmd = rules.summarize_command(e.tenant, e.agent, e.run, [x.id for x in older], answer.value.summary,
                                      e.occurred_at, self.model.model, user=e.user)
        self.tally["runs_summarized"] += 1
        log.info("run_compressed", **ctx)
        return [Out(COMMANDS.name, COMMANDS.key_bytes(cmd), self.codec.encode(cmd))] + used

    async def _shown(self, partition: int, offset: int, e: Any) -> tuple[list[rules.Entry], str | None]:
        """The run as the view shows it once the redis-projection worker has folded this
        partition up to the entry (a run's events share its agent's partition, in order)."""
        assert self.records is not None and self.runs is not None  # `process` asserted `runs`, set with `records`
        field = checkpoint_key(self.settings.topic(EVENTS.name), partition)
        await until_folded(self.records.checkpoints, field, offset, self.stopping, VIEW_WAIT_S, "redis-projection",
                           inclusive=True)
        return await self.runs.session(e.tenant, e.agent, e.run, e.occurred_at, e.user)

    def _usage(self, u: Any) -> Out:
        return Out(USAGE.name, USAGE.key_bytes(u), self.codec.encode(u))

    async def batch_done(self) -> list[Out]:
        if self.tally:
            log.info("runs_compressed", **self.tally)
            self.tally = Counter()
        return []
