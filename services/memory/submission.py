"""Command submission: a command sent to the commands log and, when its caller waits, its
outcome once the ledger applied it and the record view shows it (read-your-writes).

A command is refused before sending when it cannot be encoded or is over its size limit
(`encoded`). An answer never carries a record its caller could not read (`readable_by`).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic_core import PydanticSerializationError, to_json

from events.base import utcnow
from events.codec import Codec
from events.commands import block_field
from events.errors import ErrorCode
from events.limits import COMMAND_LIMIT, largest_field, too_large
from projections.redis.applied_waiter import Key, command_key, record_key
from projections.redis.run_view import RunView
from services.errors import ApiError
from services.memory.context import Context
from services.memory.ports import CommandPublisher
from services.memory.rules import readable_by

if TYPE_CHECKING:
    from projections.redis.record_view import RedisRecords
    from workers.followers.memory_shards import MemoryShards


class Sender(Protocol):
    """What submission reads of the memory commands: the log it sends to, the index's shards
    whose projection answers a wait, the record view, and how long read-your-writes waits."""

    records: RedisRecords
    memory: MemoryShards | None
    publisher: CommandPublisher
    READ_YOUR_WRITES_S: float


class CommandSubmission:
    def __init__(self, commands: Sender) -> None:
        self.commands = commands

    def rejected(self, events: list[Any]) -> None:
        for e in events:
            if e.type == "CommandRejected":
                raise ApiError(e.code, e.field, e.reason)

    def consent_outcome(self, state: str) -> Any:
        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            async def shown() -> bool:
                return (await self.commands.records.subject(cmd.tenant, cmd.agent, cmd.user)).consent == state

            result = await self.state_outcome(shown, f"consent {state} for {cmd.user}")(cmd, events)
            return {**result, "user": cmd.user, "consent": state}

        return outcome

    def state_outcome(self, shown: Any, what: str) -> Any:
        """Answers once the view applied this command's own change: a concurrent command (a
        withdrawal racing this grant) may have changed the state since. `shown` is the first look."""
        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self.rejected(events)
            await self.applied(cmd, shown, what)
            return {"command_id": cmd.command_id, "status": "applied"}

        return outcome

    async def applied(self, cmd: Any, shown: Any, what: str) -> None:
        """Until the view announces it applied `cmd`'s block or subject change, or shows it (`shown`)."""
        key = command_key(cmd.tenant, cmd.agent, cmd.command_id)
        applied = self.commands.records.applied()

        async def mine() -> bool:
            return applied.announced(key) or await shown()

        await self.seen(cmd, key, 0, mine, what)

    async def erase_outcome(self, cmd: Any, events: list[Any]) -> dict[str, Any]:
        """How many records were erased, once the view shows each one tombstoned or purged (the
        view drops an erased subject's rows and consent when it applies `SubjectErased`)."""
        self.rejected(events)
        erased = {e.record.id: e.record.version for e in events if e.type == "RecordDeleted"}
        withdrawn = any(e.type == "ConsentWithdrawn" for e in events)
        # The view purges the subject's consent when it applies `SubjectErased`, which a batch of
        # the projection may reach after the withdrawal: the answer waits for the purge too.
        purged = any(e.type == "SubjectErased" for e in events)

        async def shown() -> bool:
            consent = (await self.commands.records.subject(cmd.tenant, cmd.agent, cmd.user)).consent
            if (withdrawn and consent == "granted") or (purged and consent is not None):
                return False
            found = {r.id: r.version for r in await self.commands.records.get_many(cmd.tenant, cmd.agent, list(erased))}
            return all(found.get(rid, v) >= v for rid, v in erased.items())

        await self.until(cmd, shown, f"the erasure of {cmd.user}'s memory")
        return {"command_id": cmd.command_id, "status": "applied", "user": cmd.user, "erased": len(erased)}

    async def until(self, cmd: Any, shown: Any, what: str) -> None:
        """Read-your-writes for what the view keeps outside records and blocks (consent,
        removals), which it does not announce: read again until it shows."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.commands.READ_YOUR_WRITES_S
        while not await shown():
            if loop.time() >= deadline:
                raise ApiError(
                    ErrorCode.TIMEOUT, None,
                    f"command {cmd.command_id} was applied by the ledger, but the record view (the redis-projection "
                    f"worker) did not show {what} within {self.commands.READ_YOUR_WRITES_S:g} s; check that worker")
            await asyncio.sleep(0.02)

    async def submit(self, cmd: Any, wait: bool, outcome: Any = None, ctx: Context | None = None) -> dict[str, Any]:
        """Sends `cmd`; with `wait`, answers its outcome: `outcome`'s, or the records it wrote
        that `ctx` may read (none without a `ctx`)."""
        data = encoded(cmd, self.commands.publisher.codec)
        # A cast, not an assert: a service built without shards fails a wait here as it always did.
        shards = cast("MemoryShards", self.commands.memory)
        fut = shards.wait_for(cmd.command_id, cmd.tenant, cmd.agent) if wait else None
        try:
            await self.commands.publisher.send(cmd, data)
        except BaseException:
            if fut is not None:
                fut.cancel()  # nobody waits for a command that was never sent
            raise
        if fut is None:
            return {"command_id": cmd.command_id, "status": "accepted"}
        try:
            events = await asyncio.wait_for(fut, timeout=30)
        except TimeoutError:
            raise ApiError(
                ErrorCode.TIMEOUT, None,
                f"command {cmd.command_id} was accepted but not applied within 30 s; check the workers"
            ) from None
        if outcome is not None:
            return await outcome(cmd, events)
        return await self.written(cmd, events, ctx)

    async def written(self, cmd: Any, events: list[Any], ctx: Context | None) -> dict[str, Any]:
        """What the command wrote, as its caller may read it: a record `ctx` could not read
        (`readable_by`, as the reads decide) is never in the answer, and never gives its id.
        (A command id another caller used before is answered with that caller's events.)"""
        self.rejected(events)
        result: dict[str, Any] = {"command_id": cmd.command_id, "status": "applied", "memories": []}
        for e in events:
            if e.type == "WriteStaged":
                result["status"] = "pending_turn"
            elif e.type == "WriteDiscarded":
                result["status"] = "discarded"
                result["reason"] = e.reason
            elif e.type == "BlockChanged":
                result["block"] = {"label": e.label, "text": e.text,
                                   **({"application": e.application} if e.application else {})}
            elif e.type == "RunEntryAdded":
                result["run_entry"] = {"id": e.entry_id, "run_id": e.run, "record_id": e.record_id}
            elif hasattr(e, "record"):
                if ctx is None or not readable_by(ctx, e.record):
                    continue
                result["memories"].append(e.record.model_dump(mode="json"))
                if getattr(e, "merged", False):
                    result["merged"] = True
                    result["id"] = e.record.id
                elif e.type in ("RecordAdded", "RecordDeleted", "RecordPinned", "RecordUnpinned", "RecordRevised",
                                "RecordRestored"):
                    result.setdefault("id", e.record.id)
        # Read-your-writes: the Redis projection is a separate process; wait for it too, and
        # never answer "applied" for what a read right after would not show.
        if block := result.get("block"):
            at = block_field(block["label"], block.get("application"))  # as the view keys it

            async def block_shown() -> bool:
                return (await self.commands.records.blocks(cmd.tenant, cmd.agent)).get(at, "") == block["text"]

            await self.applied(cmd, block_shown, f"block {block['label']}'s new text")
        if entry := result.get("run_entry"):
            await self.until(cmd, partial(self.entry_shown, cmd, entry),
                             f"entry {entry['id']} of run {entry['run_id']}")
        if "id" in result:
            rid = result["id"]
            want = max(m["version"] for m in result["memories"] if m["id"] == rid)

            async def record_shown() -> bool:
                r = await self.commands.records.get(cmd.tenant, cmd.agent, rid)
                return bool(r and r.version >= want)

            await self.seen(cmd, record_key(cmd.tenant, cmd.agent, rid), want, record_shown,
                             f"version {want} of record {rid}")
        return result

    async def entry_shown(self, cmd: Any, entry: dict[str, Any]) -> bool:
        """Whether the run view (session memory, folded by the redis-projection worker) shows the entry."""
        entries, _ = await RunView(self.commands.records).session(cmd.tenant, cmd.agent, entry["run_id"], utcnow(),
                                                     cmd.user)
        return any(x.id == entry["id"] for x in entries)

    async def seen(self, cmd: Any, key: Key, version: int, shown: Any, what: str) -> None:
        """Until the record view (the redis-projection worker's) shows the change: `shown` is read
        now and each time the worker announces applying `key` at `version` or later. Raises TIMEOUT
        naming the command and what the view did not show."""
        if not await self.commands.records.applied().wait(key, shown, self.commands.READ_YOUR_WRITES_S, version):
            raise ApiError(
                ErrorCode.TIMEOUT, None,
                f"command {cmd.command_id} was applied by the ledger, but the record view (the redis-projection "
                f"worker) did not show {what} within {self.commands.READ_YOUR_WRITES_S:g} s; check that worker and "
                "read again before writing again")


def encoded(cmd: Any, codec: Codec) -> bytes:
    """The command as sent, refused before sending when it is over `COMMAND_LIMIT` (every
    event the ledger makes of it must fit the broker's message limit) or holds a string
    that is not text (a lone surrogate cannot be encoded)."""
    try:
        data = codec.encode(cmd)
    except PydanticSerializationError:
        field = next((f for f in type(cmd).model_fields if not _serializable(getattr(cmd, f))), None)
        raise ApiError(ErrorCode.VALIDATION_FAILED, field, f"{field or 'the command'} holds a string that is not valid "
                       "Unicode text (a lone surrogate); send UTF-8 text", 422) from None
    if len(data) > COMMAND_LIMIT:
        field = largest_field(cmd)
        raise ApiError(ErrorCode.LIMIT_EXCEEDED, field, too_large("the command", len(data), COMMAND_LIMIT, field), 413)
    return data


def _serializable(value: Any) -> bool:
    try:
        to_json(value)
    except PydanticSerializationError:
        return False
    return True
