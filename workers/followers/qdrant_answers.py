"""Read-your-writes in the Qdrant projection: a caller waiting for a command is answered once
the command's events are searchable here.

A command the ledger had decided before is answered from the ledger's replies (`REPLIES`)
instead, once this projection has applied every event committed when the reply was read,
so an answer never comes before what it says was written.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from typing import Any, cast

import structlog
from aiokafka import TopicPartition

from events.base import command_key
from events.codec import Codec, ContractError
from events.lean import LeanEvent, decode_lean
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS
from settings import Settings
from workers.runtime.topic_reader import TopicReader, tp_key

log = structlog.get_logger()
DONE_COMMANDS = 50_000  # commands waited for whose events are partly in, at most


class ReadYourWrites:
    """The read-your-writes part of `QdrantProjection`, which sets this state up."""

    settings: Settings
    codec: Codec  # opens the events a waiter gets
    keys: Any  # workers.runtime.data_keys.KeyTopic: caught up on when a key is not known yet
    parked_commands: Counter[str]  # command_key -> its events still parked (`Join`)
    waiters: dict[str, list[asyncio.Future]]  # command_key -> its callers
    done_commands: OrderedDict[str, list[LeanEvent]]  # command_key -> its events in so far
    # The ledger's answers to a command it had decided before (`REPLIES`), each with the
    # event offset of its partition the projection must have applied first: (events' partition
    # key, that offset, the answer's event).
    replies: list[tuple[str, int, LeanEvent]]
    replying: set[str]  # commands an answer, not their first events, is answering
    # Per events partition, the position every message before which is applied here; unlike
    # a checkpoint, it moves past transactions' commit markers, as a partition's end does.
    applied_to: dict[str, int]
    _answering: set[asyncio.Task]  # answers waiting for a key to be learnt

    def wait_for(self, command_id: str, tenant: str, agent: str) -> asyncio.Future:
        """Resolves with the command's (full) events once they are searchable. Call it
        before sending the command: only commands someone waits for are tracked. Keyed by
        tenant and agent too: two agents may send the same command id."""
        key = command_key(tenant, agent, command_id)
        fut = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(key, []).append(fut)
        fut.add_done_callback(lambda f: self._drop_waiter(key, f) if f.cancelled() else None)
        return fut

    def _drop_waiter(self, cid: str, fut: asyncio.Future) -> None:
        """A caller gave up (timed out): drop its waiter and, if it was the last, the command."""
        left = [f for f in self.waiters.get(cid, []) if f is not fut]
        if left:
            self.waiters[cid] = left
        else:
            self.waiters.pop(cid, None)
            self.done_commands.pop(cid, None)
            self.replying.discard(cid)

    def _complete(self, cid: str) -> bool:
        """A command is done once its last event is in and none of its events is parked."""
        events = self.done_commands.get(cid)
        return bool(events) and not self.parked_commands[cid] and any(e.last for e in cast("list[LeanEvent]", events))

    def _command_done(self, event: LeanEvent) -> None:
        cid = command_key(event.tenant, event.agent, event.command_id)
        if cid not in self.waiters:
            return
        self.done_commands.setdefault(cid, []).append(event)
        while len(self.done_commands) > DONE_COMMANDS:
            self.done_commands.popitem(last=False)
        if self._complete(cid):
            done, futs = self.done_commands.pop(cid), self.waiters.pop(cid)
            try:
                events = [e.full(self.codec) for e in done]
            except (KeyMissing, KeyDestroyed, ContractError) as err:
                self._answer_later(done, futs, err)
                return
            for fut in futs:
                if not fut.done():
                    fut.set_result(events)

    async def _take_replies(self, c: TopicReader, tp: TopicPartition, msgs: list[Any]) -> None:
        """The ledger's answers read: each waits until this projection has applied every event
        committed when the answer was read (its command's first events among them: committed in
        the same transaction or before), so an answer never comes before what it says was written."""
        events_tp = TopicPartition(self.settings.topic(EVENTS.name), tp.partition)
        waited = []
        for m in msgs:
            try:
                event = decode_lean(m.value)
            except ContractError as err:
                log.warning("projection_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                continue
            if command_key(event.tenant, event.agent, event.command_id) in self.waiters:
                waited.append(event)
        if waited:
            need = (await c.ends([events_tp]))[events_tp]  # asked now: a position fetched earlier may be older
            self.replies += [(tp_key(events_tp), need, e) for e in waited]

    def _answer_replies(self) -> None:
        """Answers whose events are applied here resolve their waiters, as the events themselves
        would have; a waiter the first events already answer (it waited before they came) keeps
        theirs."""
        left = []
        for part, need, event in self.replies:
            cid = command_key(event.tenant, event.agent, event.command_id)
            if cid not in self.waiters or (cid in self.done_commands and cid not in self.replying):
                continue  # nobody waits, or the command's first events are answering
            if self.applied_to.get(part, 0) < need or self.parked_commands[cid]:
                left.append((part, need, event))
                continue
            self.replying.add(cid)
            self._command_done(event)
            if cid not in self.waiters:
                self.replying.discard(cid)
        self.replies = left

    def _answer_later(self, done: list[LeanEvent], futs: list[asyncio.Future], err: Exception) -> None:
        """A waiter's events sealed under a key this process has not learned yet: caught up on
        in the background (the loop goes on), then opened for it."""
        async def answer() -> None:
            try:
                if isinstance(err, KeyMissing) and self.keys is not None:
                    await self.keys.catch_up()
                events = [e.full(self.codec) for e in done]
            except Exception as e:
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(e)
                return
            for fut in futs:
                if not fut.done():
                    fut.set_result(events)

        task = asyncio.get_running_loop().create_task(answer())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
