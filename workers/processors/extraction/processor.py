"""The extraction worker: reads `memlane.turns`, forwards outcomes, reviews committed turns.

- Each turn's outcome goes to the ledger as a TurnOutcome command keyed by agent, so the
  ledger never reads `memlane.turns`. add_memory tool calls carried in a committed turn
  become AddMemory commands staged on that turn, after the write-time filter; a refused
  call becomes a CandidateRefused usage record instead.
- With a model configured, a committed turn of an agent with memory enabled is reviewed
  when its cadence is due (`workers.processors.extraction.cadence`): the window of unreviewed
  messages and the most similar existing memories (from the search API, under integer
  handles) go to the model in one call, and its add/replace/delete decisions become
  commands staged on the turn, after the write-time filter (`events.rules.write_filter`).
- Everything a turn produces (tool writes, proposals, usage, refusals, the outcome) goes
  out in one Kafka transaction with the input offset. A crash before it commits leaves
  nothing; the turn is processed again with the same command ids (turn event id, attempt,
  candidate index), so it is never extracted twice in effect.
- Before any memory work, a turn's subject (tenant, member, agent) is asked the one rule
  every entry point asks (`events.rules.subjects.refusal`: consent, channel, removal). A
  refused turn gets no review and its tool writes are not forwarded; a `MemorySkipped`
  usage record says why, and its outcome is still forwarded (the ledger resolves every
  turn). A committed turn that did not complete (failed, stopped, output restricted) is
  not reviewed and its messages never join a later window; the tool calls the agent made
  during it are still forwarded, staged on the turn, like any turn's. The ledger checks
  consent again when it applies each write, so a review still in flight when consent is
  withdrawn writes nothing after the withdrawal.
- When the model keeps failing (timeouts, 429s, 5xx, malformed output after one repair),
  the turn goes to `memlane.turns.dlq` for the review only: its outcome and tool writes
  are still forwarded in the same transaction, and none of its proposals are. Holding the
  outcome back instead would leave the agent's own writes staged forever on a model
  outage; the DLQ copy is enough to run the review again later, and re-forwarding the
  outcome then is harmless (the ledger resolves a turn once).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal, cast

import structlog
from pydantic import ValidationError

from events.base import utcnow
from events.codec import Codec
from events.commands import AddMemory, TurnOutcome
from events.config import AgentConfig
from events.record import Source
from events.rules import extraction_review as review
from events.rules import subjects, write_filter
from events.sealing import subject_of
from events.topics import COMMANDS, TURNS, USAGE, session_key
from events.turns import TurnCommitted, TurnRolledBack
from events.usage import CandidateRefused, MemorySkipped, TurnReviewed
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from workers.clients.api_reader import ApiReader
from workers.clients.model_client import CallContext, ModelClient, ModelFailed
from workers.processors.extraction.cadence import ReviewState
from workers.runtime.dlq import replay_origin
from workers.runtime.runner import DeadLetter, Out, Processor, metrics, release_key

log = structlog.get_logger()
NAMESPACE = uuid.UUID("0e3b7f0c-4f4e-4d0b-8d8a-7f7d0f6a5b21")
ANSWER_SCHEMA = review.answer_schema()  # the same for every review: built once


def command_id(event_id: str, part: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{event_id}/{part}"))


def tool_writes(turn: TurnCommitted, kinds_required: bool = False) -> tuple[list[AddMemory], list[CandidateRefused]]:
    """add_memory calls the agent made during the turn, as commands staged on the turn, and
    the calls the write-time filter refused, as usage records. An agent's tool write passes
    the same filter as a model's proposal. `kinds_required`: a call that names no kind is refused."""
    out, refused = [], []
    for msg in turn.messages:
        for call in msg.tool_calls:
            if call.name != "add_memory":
                continue
            if kinds_required and not call.arguments.get("kind"):
                log.warning("tool_call_refused", call_id=call.id, field="kind", reason="kind_required",
                            agent=turn.agent)
                refused.append(_refused(turn, f"tool-refused/{call.id}", "invalid: kind is required on every "
                                        "write (memory.kinds_required) (add_memory tool call, kind)", ""))
                continue
            try:
                cmd = AddMemory(
                    command_id=command_id(turn.event_id, call.id),
                    tenant=turn.tenant,
                    agent=turn.agent,
                    issued_at=turn.occurred_at,
                    provenance=turn.provenance(Source.TOOL).model_copy(update={"source_message_ids": [msg.id]}),
                    turn_ref=turn.turn_ref,
                    preview=turn.preview,
                    session=turn.session,
                    # The turn's member, never the call's: an argument naming a user (or a
                    # tenant) collides with these and the call is refused as invalid.
                    user=turn.user,
                    **call.arguments,
                )
            except ValidationError as e:
                # Where and what, never the value: a bad call can carry the very text to keep out.
                errors = [f"{'.'.join(map(str, err['loc']))}: {err['type']}" for err in e.errors(include_input=False)]
                log.warning("tool_call_invalid", call_id=call.id, errors=errors[:10], agent=turn.agent)
                continue
            except TypeError as e:
                log.warning("tool_call_invalid", call_id=call.id, error=type(e).__name__, agent=turn.agent)
                continue
            hit = write_filter.check_write(cmd.summary, cmd.content, cmd.kind, cmd.labels, cmd.metadata, cmd.key,
                                           tags=" ".join(cmd.tags), classification=cmd.classification)
            if hit is None:
                out.append(cmd)
                continue
            r = hit.refusal
            log.warning("tool_call_refused", call_id=call.id, field=hit.field, reason=r.reason, detail=r.detail,
                        agent=turn.agent)
            preview = "" if r.reason in ("pii", "secret") or hit.field != "summary" else cmd.summary[:80]
            refused.append(_refused(turn, f"tool-refused/{call.id}",
                                    f"{r.reason}: {r.detail} (add_memory tool call, {hit.field})", preview))
    return out, refused


def outcome(turn: TurnCommitted | TurnRolledBack) -> TurnOutcome:
    committed = isinstance(turn, TurnCommitted)
    return TurnOutcome(
        command_id=command_id(turn.event_id, "outcome"),
        tenant=turn.tenant,
        agent=turn.agent,
        issued_at=turn.occurred_at or utcnow(),
        provenance=turn.provenance(Source.TOOL),
        turn_ref=turn.turn_ref,
        preview=turn.preview,
        committed=committed,
        reason="" if committed else (cast(TurnRolledBack, turn).reason or "turn rolled back"),
    )


def _usage_of(turn: TurnCommitted, part: str) -> dict[str, Any]:
    """The fields a turn's usage record shares; its id derives from the turn and `part`, so a
    replay makes the same one."""
    return dict(usage_id=str(uuid.uuid5(NAMESPACE, f"{turn.event_id}/{part}")), tenant=turn.tenant,
                agent=turn.agent, occurred_at=turn.occurred_at, session=turn.session,
                execution_id=turn.execution_id, turn=turn.turn)


def skipped(turn: TurnCommitted,
            reason: Literal["consent_required", "channel_not_allowed", "turn_not_completed", "subject_removed"],
            detail: str) -> MemorySkipped:
    """The usage record of a turn that got no memory work; one per turn attempt."""
    return MemorySkipped(**_usage_of(turn, f"skipped/{turn.attempt}"), user=turn.user, reason=reason, detail=detail)


def refusal_usage(turn: TurnCommitted, r: review.Refused) -> CandidateRefused:
    # PII and secrets are refused precisely because their text must not be kept: no preview.
    preview = "" if r.reason in ("pii", "secret") else r.summary[:80]
    return _refused(turn, f"refused/{turn.attempt}/{r.index}", f"{r.reason}: {r.detail}", preview)


def _refused(turn: TurnCommitted, part: str, reason: str, preview: str) -> CandidateRefused:
    """A refusal's usage record. A member's turn keeps no preview: usage records are read by
    operators, who never read a member's words."""
    return CandidateRefused(**_usage_of(turn, part), reason=reason,
                            summary_preview="" if turn.user is not None else preview)


class ExtractionProcessor(Processor):
    name = "extraction"
    sources = (TURNS.name,)
    transactional = True
    concurrent_keys = True  # sessions are reviewed in parallel; a session's turns in order

    def __init__(self, settings, redis: Connect, *, codec: Codec, model: Callable[[], ModelClient],
                 api: Callable[[], ApiReader]) -> None:
        super().__init__(settings, codec=codec)
        self.redis_at = redis
        self.make_model, self.make_api = model, api  # made in `start`, in the worker's event loop
        self.model: ModelClient | None = None
        self.api: ApiReader | None = None
        self.records: RedisRecords | None = None
        self.redis = None
        self.state: ReviewState | None = None
        # Subjects that were open (no refusal), by (tenant, agent, user): when read, for
        # `config_cache_s` seconds. Only open ones: a grant takes effect on the next turn,
        # while a withdrawal the copy has not seen yet costs at most a review whose
        # proposals the ledger refuses (it checks consent again when it applies them).
        self.open_subjects: dict[tuple[str, str, str | None], tuple[float, subjects.SubjectState]] = {}
        self.tally: Counter[str] = Counter()  # the current batch, for its summary line
        # Turns an operator replayed from the DLQ (workers.runtime.dlq), (partition, offset) -> the
        # offset the turn first had: it is reviewed as there, where the cadence state still
        # says what its review shows (at its new offset, its messages count as seen).
        self.replays: dict[tuple[int, int], int] = {}

    def decode_message(self, source: str, message: Any) -> Any:
        origin = replay_origin(getattr(message, "headers", None))
        if origin is not None and origin[0] == message.partition:
            self.replays[(message.partition, message.offset)] = origin[1]
        return super().decode_message(source, message)

    async def start(self) -> None:
        s = self.settings
        if s.memory_kill_switch:
            log.warning(
                "extraction_off",
                reason="AGENT_MEMORY_KILL_SWITCH turns memory off: turn outcomes are forwarded; reviews and "
                "add_memory tool calls in turns are not (counted in each batch's turns_forwarded line)",
            )
            return
        # Even without a model: a tool write is forwarded only for a subject that may have memory.
        self.api = self.make_api()
        self.records = RedisRecords(self.redis_at(pooled=True), namespace=s.topic_prefix, codec=self.codec)
        if not s.model_configured:
            log.warning(
                "extraction_off",
                reason="no model configured (set OPENAI_BASE_URL and/or OPENAI_API_KEY); "
                "turn outcomes and add_memory tool calls are still forwarded",
            )
            return
        self.model = self.make_model()
        self.redis = self.redis_at(decode_responses=False)
        self.state = ReviewState(self.redis, namespace=s.redis_root, keys=self.keys, cipher=self.codec.cipher)
        log.info("extraction_on", model=s.model, base_url=s.openai_base_url or "api.openai.com")

    async def revoked(self, partitions: set[Any]) -> None:
        if self.state is not None:
            self.state.forget({tp.partition for tp in partitions})

    async def stop(self) -> None:
        for closer in (self.model and self.model.close, self.api and self.api.close, self.redis and self.redis.aclose,
                       self.records and self.records.aclose):
            if closer:
                await closer()

    async def process(self, source: str, partition: int, offset: int, turn: Any) -> list[Any]:
        if not isinstance(turn, (TurnCommitted, TurnRolledBack)):
            return []
        commands, refused = tool_writes(turn) if isinstance(turn, TurnCommitted) else ([], [])
        if (commands or refused) and self.settings.memory_kill_switch:
            self.tally["tool_writes_refused_kill_switch"] += len(commands) + len(refused)
            commands, refused = [], []
        reviewed: dict[str, Any] = {}  # what the review did, for the turn's log line
        extra: list[Any] = []
        # Without a model, a turn's only memory work is its tool writes: a turn with none
        # needs no configuration or subject read.
        if isinstance(turn, TurnCommitted) and self.api is not None and (self.model is not None or commands or refused):
            cfg = await self.api.config(turn.tenant, turn.agent)
            if cfg.memory.kinds_required and (commands or refused):
                commands, refused = tool_writes(turn, kinds_required=True)
            refusal = await self.refusal(cfg, turn)
            if refusal is not None:
                self.tally[f"skipped_{refusal.skipped}"] += 1
                self.tally["tool_writes_skipped"] += len(commands) + len(refused)
                commands, refused = [], []
                reviewed["review"] = refusal.skipped
                extra.append(self._usage_out(skipped(turn, refusal.skipped, f"{refusal.code.value}: {refusal.reason}")))
            elif self.model is not None:
                at = self.replays.get((partition, offset), offset)
                extra += await self.review(turn, cfg, partition, at, reviewed)
        if refused:
            self.tally["tool_writes_refused"] += len(refused)
        extra = [self._usage_out(u) for u in refused] + extra
        proposals = [c for c in extra if isinstance(c, Out) and c.topic == COMMANDS.name]
        others = [c for c in extra if c not in proposals]  # usage records and a DeadLetter
        cast("list[AddMemory | TurnOutcome]", commands).append(outcome(turn))  # the writes, then the outcome
        self.tally["turns"] += 1
        self.tally["proposals"] += len(proposals)
        self.tally[f"review_{reviewed.get('review', 'none')}"] += 1
        self.tally["refused"] += reviewed.get("refused", 0)
        # Per turn at debug level, and a summary per batch (`batch_done`): at hundreds of
        # turns per second a line each was a visible part of the worker's CPU. Refusals and
        # failures still get their own warning lines.
        log.debug(
            "turn_forwarded",
            event_id=turn.event_id,
            turn=turn.turn,
            agent=turn.agent,
            committed=isinstance(turn, TurnCommitted),
            writes=len(commands) - 1,
            proposals=len(proposals),
            partition=partition,
            offset=offset,
            **reviewed,
        )
        # The turn's tool writes, its outcome, then the review's proposals. The tool writes are
        # staged on the turn and applied when the outcome resolves it. A review only follows a
        # committed turn, so its proposals arrive after the outcome and apply at once. Staged
        # instead, each would cost the ledger a `WriteStaged` event (about 1.2 kB, which every
        # projection reads and skips) and a decode when the turn resolves.
        return [Out(COMMANDS.name, COMMANDS.key_bytes(c), self.codec.encode(c)) for c in commands] + proposals + others

    async def refusal(self, cfg: AgentConfig, turn: TurnCommitted) -> subjects.Refusal | None:
        """Why the turn's subject gets no memory, or None: the one rule every entry point
        asks, over the record view's state of the subject, read once per turn (an open
        subject's state is reused for `config_cache_s`)."""
        assert self.records is not None
        key = (turn.tenant, turn.agent, turn.user)
        hit = self.open_subjects.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.settings.config_cache_s and self._open(cfg, turn, hit[1]):
            state = hit[1]
        else:
            state = await self.records.subject(turn.tenant, turn.agent, turn.user)
            if self._open(cfg, turn, state):
                self.open_subjects[key] = (now, state)
                if len(self.open_subjects) > 10_000:
                    self.open_subjects.pop(next(iter(self.open_subjects)))
            else:
                self.open_subjects.pop(key, None)
        return subjects.refusal(cfg, turn.user, turn.channel, state)

    @staticmethod
    def _open(cfg: AgentConfig, turn: TurnCommitted, state: subjects.SubjectState) -> bool:
        # What the subject's state allows, whatever the turn's channel (a channel is allowed or not
        # by the configuration alone).
        return subjects.refusal(cfg, turn.user, None, state) is None

    async def review(self, turn: TurnCommitted, cfg: AgentConfig, partition: int, offset: int,
                     reviewed: dict[str, Any]) -> list[Any]:
        """The turn's review outputs. What it did goes into `reviewed`, for the caller's
        per-turn debug line and per-batch summary."""
        assert self.api and self.state and self.model
        if not cfg.memory.enabled:
            reviewed["review"] = "memory_disabled"
            return []
        if turn.status != "completed":
            # Not observed either: a failed, stopped or restricted turn's messages never
            # join a later turn's window.
            reviewed["review"] = "turn_not_completed"
            self.tally["skipped_turn_not_completed"] += 1
            return [self._usage_out(skipped(turn, "turn_not_completed", f"the turn ended {turn.status}; "
                                                                         "only a completed turn is reviewed"))]
        msgs = [review.compact(m) for m in turn.messages if review.reviewable(m)]
        observed = await self.state.observe(partition, session_key(turn), offset, msgs, cfg.memory.extraction,
                                            subject_of(turn.tenant, turn.agent, turn.user))
        # The cadence state is all that orders a session's turns: the next turn's window
        # depends on this one's facts, never on its review (whose proposals only apply after
        # the batch commits). Retried, `observe` gives the same answer (offset-indexed).
        release_key()
        # The facts must be in Redis before this turn's transaction commits; the session's
        # next turn need not wait for that (the state keeps a copy).
        await observed.saved
        due = observed.due
        ctx = dict(event_id=turn.event_id, turn=turn.turn, agent=turn.agent, session=turn.session, offset=offset)
        if not due.due:
            reviewed.update(review="not_due", since=due.since, every=str(cfg.memory.extraction.every))
            return []
        shown = review.window(due.pending)
        if not shown:
            reviewed["review"] = "nothing_to_show"
            return []
        queries = review.search_queries(shown)
        found = await self.api.similar(turn, queries) if queries else []
        # A message a fact was already made from is not asked about again.
        shown = review.uncited(shown, found, turn.session)
        if not shown:
            reviewed["review"] = "all_cited"
            return []
        handles = review.Handles.of(found)
        call = CallContext(turn.tenant, turn.agent, turn.session, turn.execution_id, turn.turn, f"{turn.event_id}/{turn.attempt}")
        messages = review.build_messages(cfg, turn.session, shown, handles, turn.user)
        try:
            answer = await self.model.json_call(messages, ANSWER_SCHEMA, review.parse_answer, call)
        except ModelFailed as e:
            log.error("review_failed_turn_dead_lettered", error=e.error, attempts=e.attempts, **ctx)
            reviewed["review"] = "dead_lettered"
            return [self._usage_out(u) for u in e.usage] + [DeadLetter(f"extraction review: {e.error}", e.attempts)]
        decided = review.to_commands(turn, cfg, answer.value, shown, handles, self.model.model)
        metrics.extraction_decided(decided)
        for r in decided.refused:
            log.warning("candidate_refused", index=r.index, reason=r.reason, detail=r.detail, **ctx)
        reviewed.update(
            review="done",
            shown=len(shown),
            handles=len(handles.records),
            proposed=len(decided.commands),
            refused=len(decided.refused),
            skipped=decided.skipped,
            attempts=answer.attempts,
            prompt_sha=hashlib.sha256(messages[0]["content"].encode()).hexdigest()[:12],
        )
        return (
            [Out(COMMANDS.name, COMMANDS.key_bytes(c), self.codec.encode(c)) for c in decided.commands]
            + [self._usage_out(u) for u in answer.usage]
            + [self._usage_out(refusal_usage(turn, r)) for r in decided.refused]
            + [self._usage_out(TurnReviewed(**_usage_of(turn, f"reviewed/{turn.attempt}"), user=turn.user,
                                            decided=review.decisions(decided), skipped=decided.skipped,
                                            refused=len(decided.refused)))]
        )

    async def batch_done(self) -> list[Out]:
        self.replays.clear()
        if self.tally:
            if self.api is not None:
                self.tally.update(self.api.requests)
                self.api.requests.clear()
            log.info("turns_forwarded", **self.tally)
            self.tally = Counter()
        return []

    def _usage_out(self, u: Any) -> Out:
        return Out(USAGE.name, USAGE.key_bytes(u), self.codec.encode(u))
