"""`memlane worker consolidation`: a session that ended becomes an episode (docs/features/consolidation.md).

It reads `memlane.turns` in its own consumer group and acts on `SessionEnded` only. The
session's kept history comes from the history view in Redis, once the history worker has
folded every turn before the end on that partition (a session's turns and its end share a
partition, in order). One model call (purpose `consolidation`) gives the episode, a
procedure or an anti-pattern when the run has one, and the run's canonical facts of the
agent's kinds (`events.rules.consolidation`); they go
to the ledger as commands, with the usage records, in one transaction with the input
offset, so a crash never consolidates a session twice in effect (the command ids follow the
SessionEnded event). A model that keeps failing sends the SessionEnded to the DLQ.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from events.codec import Codec
from events.rules import consolidation as rules
from events.rules import subjects
from events.rules.history import HistoryFilter
from events.topics import COMMANDS, TURNS, USAGE
from events.turns import SessionEnded
from events.usage import CandidateRefused, MemorySkipped
from projections.redis.connection import Connect
from projections.redis.history_view import RedisHistory
from projections.redis.record_view import RedisRecords
from projections.redis.run_view import RunView
from workers.clients.api_reader import ApiReader
from workers.clients.model_client import CallContext, ModelClient, ModelFailed
from workers.runtime.runner import DeadLetter, Out, Processor, until_folded
from workers.runtime.topic_reader import checkpoint_key

log = structlog.get_logger()
HISTORY_WAIT_S = 30.0  # how long an end waits for the history worker before it is retried
ALL_KINDS = ("message", "tool_result", "tool_error")


class ConsolidationProcessor(Processor):
    name = "consolidation"
    sources = (TURNS.name,)
    transactional = True
    concurrent_keys = True  # sessions end independently; each waits on its own model call

    def __init__(self, settings, redis: Connect, *, codec: Codec, model: Callable[[], ModelClient],
                 api: Callable[[], ApiReader]) -> None:
        super().__init__(settings, codec=codec)
        self.redis = redis
        self.make_model, self.make_api = model, api  # made in `start`, in the worker's event loop
        self.model: ModelClient | None = None
        self.api: ApiReader | None = None
        self.history: RedisHistory | None = None
        self.records: RedisRecords | None = None  # subjects' consent and removal
        self.runs: RunView | None = None
        self.tally: Counter[str] = Counter()

    async def start(self) -> None:
        s = self.settings
        if s.memory_kill_switch or not s.model_configured:
            why = "AGENT_MEMORY_KILL_SWITCH is set" if s.memory_kill_switch else (
                "no model configured (set OPENAI_BASE_URL and/or OPENAI_API_KEY)")
            log.warning("consolidation_off", reason=f"{why}; ended sessions are not consolidated")
            return
        self.model = self.make_model()
        self.api = self.make_api()
        self.history = RedisHistory(self.redis(), s.topic_prefix, codec=self.codec)
        self.records = RedisRecords(self.redis(pooled=True), namespace=s.topic_prefix, keys=self.keys,
                                    codec=self.codec)
        self.runs = RunView(self.records)  # an ended run's entries
        log.info("consolidation_on", model=s.model)

    async def stop(self) -> None:
        for closer in (self.model and self.model.close, self.api and self.api.close,
                       self.history and self.history.aclose, self.records and self.records.aclose):
            if closer:
                await closer()

    def decode(self, source: str, data: bytes) -> Any:
        # Only session ends matter here: the turns around them, most of the topic, are
        # skipped without being decoded (a TurnCommitted that merely says the word is
        # decoded and skipped below).
        return super().decode(source, data) if b"SessionEnded" in data else None

    async def process(self, source: str, partition: int, offset: int, ended: Any) -> list[Any]:
        if not isinstance(ended, SessionEnded) or self.model is None or not ended.session:
            return []  # turns are the other workers'; an agent without sessions has no history to consolidate
        assert self.api and self.history and self.records
        cfg = await self.api.config(ended.tenant, ended.agent)
        if not cfg.memory.enabled:
            self.tally["memory_disabled"] += 1
            return []
        if refused := await self._refused(ended, cfg):
            self.tally[refused.reason] += 1
            return [self._usage(refused)]
        await self._history_folded(partition, offset)
        kept, _ = await self.history.page(
            HistoryFilter(ended.tenant, ended.agent, ended.session, preview=False, kinds=ALL_KINDS, user=ended.user),
            limit=rules.SHOWN_EVENTS,
        )
        events = rules.shown_events(kept)
        entries: list[Any] = []
        if ended.run:
            assert self.runs is not None  # made with `records`
            entries, _ = await self.runs.session(ended.tenant, ended.agent, ended.run, ended.occurred_at, ended.user)
        ctx = dict(event_id=ended.event_id, agent=ended.agent, session=ended.session, offset=offset)
        if not events and not entries:
            self.tally["empty_sessions"] += 1
            log.info("session_not_consolidated", reason="no kept history", **ctx)
            return []
        call = CallContext(ended.tenant, ended.agent, ended.session, ended.execution_id, None, ended.event_id)
        try:
            kinds = rules.fact_kinds(cfg)
            answer = await self.model.json_call(rules.build_messages(ended, events, kinds, entries),
                                                rules.answer_schema(kinds),
                                                rules.parse_answer, call, purpose="consolidation")
        except ModelFailed as e:
            log.error("consolidation_failed_dead_lettered", error=e.error, attempts=e.attempts, **ctx)
            self.tally["dead_lettered"] += 1
            return [self._usage(u) for u in e.usage] + [DeadLetter(f"consolidation: {e.error}", e.attempts)]
        made = rules.to_commands(ended, cfg, answer.value, events, self.model.model, entries)
        for what, reason, detail in made.refused:
            log.warning("consolidation_refused", part=what, reason=reason, detail=detail, **ctx)
        self.tally["sessions"] += 1
        self.tally["proposals"] += len(made.commands)
        return (
            [Out(COMMANDS.name, COMMANDS.key_bytes(c), self.codec.encode(c)) for c in made.commands]
            + [self._usage(u) for u in answer.usage]
            + [self._usage(self._refusal(ended, *r)) for r in made.refused]
        )

    async def _history_folded(self, partition: int, offset: int) -> None:
        """Until the history worker has folded this partition up to the end event."""
        assert self.history is not None  # `process` asserted it
        field = checkpoint_key(self.settings.topic(TURNS.name), partition)
        await until_folded(self.history.checkpoints, field, offset, self.stopping, HISTORY_WAIT_S, "history")

    async def _refused(self, ended: SessionEnded, cfg: Any) -> MemorySkipped | None:
        """A session of a subject without consent, in a channel without memory, or of a removed
        agent or member is not consolidated: its usage record says why."""
        assert self.records is not None  # `process` asserted it
        state = await self.records.subject(ended.tenant, ended.agent, ended.user)
        no = subjects.refusal(cfg, ended.user, ended.channel, state)
        if no is None:
            return None
        return MemorySkipped(
            usage_id=str(uuid.uuid5(rules.NAMESPACE, f"{ended.event_id}/skipped")), tenant=ended.tenant,
            agent=ended.agent, occurred_at=ended.occurred_at, session=ended.session,
            execution_id=ended.execution_id, user=ended.user, reason=no.skipped, detail=f"consolidation: {no.reason}",
        )

    @staticmethod
    def _refusal(ended: SessionEnded, what: str, reason: str, detail: str) -> CandidateRefused:
        return CandidateRefused(
            usage_id=str(uuid.uuid5(rules.NAMESPACE, f"{ended.event_id}/refused/{what}")),
            tenant=ended.tenant, agent=ended.agent, occurred_at=ended.occurred_at, session=ended.session,
            execution_id=ended.execution_id, reason=f"consolidation {what}: {reason}: {detail}",
        )

    def _usage(self, u: Any) -> Out:
        return Out(USAGE.name, USAGE.key_bytes(u), self.codec.encode(u))

    async def batch_done(self) -> list[Out]:
        if self.tally:
            log.info("sessions_consolidated", **self.tally)
            self.tally = Counter()
        return []
