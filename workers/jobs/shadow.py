"""Shadow replay: an agent's recorded turns reviewed again under another extraction policy (a
prompt, a model), into a shadow state of its own, and what it decided set beside what live
extraction decided.

Nothing live is touched: the run writes to no topic, so memory, usage and consent stay as they
are. The shadow state starts as the agent's memory stood before the first replayed turn (its
log folded by the ledger's own rules), takes every live change that was not live extraction's as
it comes in the log, and the shadow policy's decisions in place of live extraction's. Each
completed turn is reviewed with its own messages (no cadence), shown the existing memories that
share the most words with them.

A run is named and resumable: its report lines and the shadow's commands per turn (sealed by the
codec) are kept under `<data dir>/shadow/<name>/` after every turn; a run of that name folds the
log again, applies the commands of the turns it reviewed before, and reviews the rest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from events.codec import PLAIN, Codec, ContractError
from events.config import AgentConfig
from events.rules import extraction_review as review
from events.rules import shadow as rules
from events.rules.ledger import LedgerState, decide, evolve
from events.rules.ledger.state import config_of, get_record
from events.topics import COMMANDS, TURNS
from events.turns import TurnCommitted, TurnRolledBack
from settings import Settings
from workers.clients.model_client import CallContext, ModelClient, ModelFailed
from workers.followers.past_memory import PastMemory
from workers.runtime.topic_reader import TopicReader

ANSWER_SCHEMA = review.answer_schema()
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ShadowRun:
    name: str
    tenant: str
    agent: str
    prompt: str
    model: str
    start: datetime | None = None
    end: datetime | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What a run of this name was started with: resumed only with the same."""
        return {"tenant": self.tenant, "agent": self.agent, "model": self.model,
                "prompt_sha": hashlib.sha256(self.prompt.encode()).hexdigest()[:16],
                "start": self.start.isoformat() if self.start else None,
                "end": self.end.isoformat() if self.end else None}


class RunMismatch(ValueError):
    """A run of that name was started with other parameters."""


@dataclass(order=True)
class _Logged:
    at_ms: int
    partition: int
    offset: int
    item: Any = dataclasses.field(compare=False)


class Shadow:
    def __init__(self, settings: Settings, codec: Codec, keys: Any, model: ModelClient, root: Path) -> None:
        self.settings, self.codec, self.keys, self.model = settings, codec, keys, model
        self.root = root  # the runs' directories

    async def run(self, run: ShadowRun, progress: Progress | None = None) -> list[dict[str, Any]]:
        """The report: a line per turn, those of earlier runs of this name first."""
        where = self.root / run.name
        where.mkdir(parents=True, exist_ok=True)
        meta = where / "run.json"
        if meta.exists() and json.loads(meta.read_text()) != run.fingerprint():
            raise RunMismatch(f"shadow run {run.name!r} was started with other parameters ({meta}); choose another "
                              "--name, or remove that directory to start it again")
        meta.write_text(json.dumps(run.fingerprint()))
        past = PastMemory(self.settings, self.codec, self.keys)
        events = [_Logged(x.at_ms, 0, x.offset, x.event) for x in await past.events(run.tenant, run.agent)]
        turns, rolled_back = await self._turns(run)
        turns = [t for t in turns if t.item.turn_ref not in rolled_back]
        start_ms = int(run.start.timestamp() * 1000) if run.start else (turns[0].at_ms if turns else 0)
        live_ids = {review.command_id(t.item, i): t.item.event_id for t in turns for i in range(review.MAX_CANDIDATES)}
        live: dict[str, list[Any]] = {}
        for e in events:
            if (turn := live_ids.get(e.item.command_id)) is not None:
                live.setdefault(turn, []).append(e.item)
        # What a run did, a line per turn: its report line and the shadow's commands (sealed by the
        # codec). A resumed run folds the log again and applies those commands where it reviewed
        # before; a line cut short by a crash is reviewed again.
        kept_path = where / "turns.jsonl"
        made = {x["line"]["event_id"]: x for x in _lines(kept_path)}
        done: list[dict[str, Any]] = []
        state, ak, at = LedgerState(), f"{run.tenant}/{run.agent}", 0
        while at < len(events) and events[at].at_ms < start_ms:
            evolve(state, events[at].item)
            at += 1
        for i, t in enumerate(turns):
            if progress:
                progress(i, len(turns))
            # Live changes up to the turn, but live extraction's: the shadow decides those.
            while at < len(events) and events[at].at_ms <= t.at_ms:
                if events[at].item.command_id not in live_ids:
                    evolve(state, events[at].item)
                at += 1
            if (kept := made.get(t.item.event_id)) is not None:
                self._apply(state, [self.codec.decode(COMMANDS.name, raw) for raw in kept["commands"]])
                done.append(kept["line"])
                continue
            line, commands = await self._review(state, ak, config_of(state, ak), t, live.get(t.item.event_id, []),
                                                run)
            with kept_path.open("a") as f:
                f.write(json.dumps({"line": line, "commands": [self.codec.encode(c).decode() for c in commands]})
                        + "\n")
            done.append(line)
        if progress:
            progress(len(turns), len(turns))
        return done

    def _apply(self, state: LedgerState, commands: list[Any]) -> list[Any]:
        """The ledger's rules over the shadow state, as the live ledger applies them (its codec for
        staged writes, its turn timeout): the events `commands` make, folded in."""
        out = []
        timeout = timedelta(seconds=self.settings.turn_timeout_s)
        for cmd in commands:
            for e in decide(state, cmd, timeout, self.codec):
                evolve(state, e)
                out.append(e)
        return out

    async def _review(self, state: LedgerState, ak: str, cfg: AgentConfig, t: _Logged, live_events: list[Any],
                      run: ShadowRun) -> tuple[dict[str, Any], list[Any]]:
        """The turn's report line, and the shadow's commands, applied to `state`."""
        turn: TurnCommitted = t.item
        line: dict[str, Any] = {"turn": f"{turn.session}/{turn.turn}", "event_id": turn.event_id, "log_ms": t.at_ms,
                                "live": rules.decisions_of(live_events).as_json(), "tokens": [0, 0]}
        cfg = cfg.model_copy(update={"memory": cfg.memory.model_copy(update={
            "extraction": cfg.memory.extraction.model_copy(update={"prompt": run.prompt})})})
        shown = review.window([review.compact(m) for m in turn.messages if review.reviewable(m)])
        decided = rules.Decisions()
        if cfg.memory.enabled and shown:
            records = [r for rid in _record_ids(state, ak) if (r := get_record(state, ak, rid)) is not None]
            handles = review.Handles.of(rules.similar(records, review.search_queries(shown)))
            messages = review.build_messages(cfg, turn.session, shown, handles, turn.user)
            call = CallContext(turn.tenant, turn.agent, turn.session, turn.execution_id, turn.turn,
                               f"{turn.event_id}/{turn.attempt}/shadow")
            try:
                answer = await self.model.json_call(messages, ANSWER_SCHEMA, review.parse_answer, call)
            except ModelFailed as failed:
                line.update(shadow=decided.as_json(), error=failed.error, differs=True, tokens=_tokens(failed.usage))
                return line, []
            proposed = review.to_commands(turn, cfg, answer.value, shown, handles, self.model.model)
            commands = [c.model_copy(update={"turn_ref": None}) for c in proposed.commands]  # a committed turn's
            decided = rules.decisions_of(self._apply(state, commands))
            line.update(skipped=proposed.skipped, refused=len(proposed.refused), tokens=_tokens(answer.usage))
        else:
            commands = []
        line.update(shadow=decided.as_json(), differs=line["live"] != decided.as_json())
        return line, commands

    async def _turns(self, run: ShadowRun) -> tuple[list[_Logged], set[str]]:
        """The agent's committed turns in the range, in log time, and the turn refs rolled back."""
        tps = [TopicPartition(self.settings.topic(TURNS.name), p) for p in range(TURNS.partitions)]
        turns, rolled_back = [], set()
        async with TopicReader(self.settings) as reader:
            msgs = await reader.read_all(tps)
        lo = int(run.start.timestamp() * 1000) if run.start else 0
        hi = int(run.end.timestamp() * 1000) if run.end else None
        for m in msgs:
            if m.timestamp < lo or (hi is not None and m.timestamp >= hi) or not m.value:
                continue
            try:
                t = PLAIN.decode(TURNS.name, m.value)  # a platform's turns are plaintext
            except ContractError:
                continue
            if (t.tenant, t.agent) != (run.tenant, run.agent):
                continue
            if isinstance(t, TurnRolledBack):
                rolled_back.add(t.turn_ref)
            elif isinstance(t, TurnCommitted) and t.status == "completed" and not t.preview:
                turns.append(_Logged(m.timestamp, m.partition, m.offset, t))
        return sorted(turns), rolled_back


def _lines(path: Path) -> list[dict[str, Any]]:
    """A run's kept lines; a last line cut short by a crash is left out."""
    out = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            break
    return out


def _record_ids(state: LedgerState, ak: str) -> list[str]:
    prefix = f"{ak}/"
    return [k[len(prefix):] for k in state.records if k.startswith(prefix)]


def _tokens(usage: list[Any]) -> list[int]:
    return [sum(u.input_tokens for u in usage), sum(u.output_tokens for u in usage)]


def summary(lines: list[dict[str, Any]], expected: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """What a run found: turns reviewed and differing, each policy's totals, the shadow's tokens,
    and with `expected` (the facts each turn should keep) each policy's precision and recall."""
    totals = {side: {k: sum(len(x[side][k]) for x in lines) for k in ("added", "replaced", "deleted")}
              for side in ("live", "shadow")}
    out: dict[str, Any] = {"turns": len(lines), "differing": sum(1 for x in lines if x["differs"]), **totals,
                           "shadow_tokens": {"input": sum(x["tokens"][0] for x in lines),
                                             "output": sum(x["tokens"][1] for x in lines)},
                           "shadow_skipped": sum(x.get("skipped", 0) for x in lines)}
    if expected is not None:
        out["score"] = {side: rules.score({x["turn"]: x[side]["added"] for x in lines}, expected)
                        for side in ("live", "shadow")}
    return out

