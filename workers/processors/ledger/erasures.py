"""The ledger worker's erasures: the keys of what was erased are destroyed once the
`SubjectErased` saying so is committed, and again after a recovery (docs/features/encryption-and-erasure.md)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from events.rules.ledger import covers, erasure_key, erasure_of, forget
from events.sealing import tenant_of

if TYPE_CHECKING:
    from settings import Settings


class Commits(Protocol):
    """The ledger's snapshot bookkeeping: events sent per partition, and what commits covered."""

    @property
    def sent_n(self) -> Mapping[int, int]: ...

    @property
    def acked(self) -> Mapping[int, tuple[int, int]]: ...


class ErasingLedger(Protocol):
    """What erasures read of the ledger that owns them: its settings, data keys, partition
    states, snapshot bookkeeping (what was sent and committed) and stop signal."""

    settings: Settings
    keys: Any
    stopping: asyncio.Event

    @property
    def states(self) -> Mapping[int, Any]: ...

    @property
    def snapshots(self) -> Commits: ...

log = structlog.get_logger()


# Clock skew between the process that stamped an erasure and those that made keys, allowed for
# when a recovery destroys an erasure's keys again.
RECOVERY_MARGIN = timedelta(minutes=5)


class Erasures:
    """Destroys the keys of what was erased, once the `SubjectErased` saying so is committed.

    An erasure waits, as a snapshot does, until the commits have covered the partition's events
    up to it. Destruction runs in the background, one erasure list after another, and is retried
    until it succeeds or the ledger stops (then the next recovery does it). A member or a tenant
    erased under the workspace agent is also forgotten by the partitions this ledger holds: their
    states were folded while the keys were there (another ledger's partitions forget it when they
    recover next, as the events no longer open).
    """

    def __init__(self, ledger: ErasingLedger) -> None:
        self.ledger = ledger
        self.waiting: list[tuple[int, int, str, datetime]] = []  # (partition, events sent, erasure, when)
        self.task: asyncio.Future | None = None
        self.destroyed = 0  # keys destroyed by this process
        # Seconds between an erasure's commit and its keys' destruction: a test kills the ledger there.
        self.delay = ledger.settings.ledger_erasure_delay_s

    def sent(self, partition: int, events: list[Any]) -> None:
        """After `Snapshots.sent`: the erasures among a command's events, and when they are committed."""
        erased = [e for e in events if e.type == "SubjectErased"]
        if erased:
            n = self.ledger.snapshots.sent_n[partition]
            self.waiting += [(partition, n, erasure_key(e.tenant, e.agent, e.user, e.tenant_wide), e.occurred_at)
                             for e in erased]

    def forget(self, partition: int) -> None:
        """A revoked partition's erasures not committed: its next owner decides them again."""
        self.waiting = [w for w in self.waiting if w[0] != partition]

    def committed(self) -> None:
        acked = self.ledger.snapshots.acked
        due = [w for w in self.waiting if acked.get(w[0], (0, -1))[0] >= w[1]]
        if due:
            self.waiting = [w for w in self.waiting if w not in due]
            self.destroy([(key, at) for _, _, key, at in due], recovered=False)

    def destroy(self, erasures: list[tuple[str, datetime]], recovered: bool) -> None:
        """In the background, after the erasures asked for before."""
        if self.ledger.keys is None:
            return
        before = self.task

        async def run() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            await self._destroyed(erasures, recovered)

        self.task = asyncio.ensure_future(run())

    async def settle(self, timeout: float = 30.0) -> None:
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout)
            except Exception as e:
                log.warning("ledger_keys_not_destroyed", error=f"{type(e).__name__}: {e}")

    async def _destroyed(self, erasures: list[tuple[str, datetime]], recovered: bool) -> None:
        keys, attempt = self.ledger.keys, 0
        assert keys is not None  # `destroy` runs this only with keys
        if self.delay and not recovered:
            try:
                await asyncio.wait_for(self.ledger.stopping.wait(), self.delay)
                return  # stopping: the next recovery destroys them
            except TimeoutError:
                pass
        forgotten = 0
        if not recovered:
            # Before any key goes: a held state that still had the subject would seal it again,
            # under a new key, in its next snapshot or decision.
            for key, at in erasures:
                if erasure_of(key)[1] is None:
                    forgotten += sum(forget(state, key, until=at) for state in list(self.ledger.states.values()))
        while True:
            try:
                await keys.catch_up()  # keys another process made are destroyed too
                counts = await self._destroy_keys(erasures, recovered)
                break
            except Exception as e:
                if self.ledger.stopping.is_set():
                    log.warning("ledger_keys_not_destroyed", erasures=len(erasures), error=f"{type(e).__name__}: {e}")
                    return
                delay = min(0.2 * 2**attempt, 5.0)
                log.warning("ledger_keys_destroy_retrying", error=f"{type(e).__name__}: {e}", delay_s=delay)
                await asyncio.sleep(delay)
                attempt += 1
        for key, at in erasures:
            # After a recovery, only what was destroyed just now can still be open in a held state.
            if recovered and erasure_of(key)[1] is None and counts[key]:
                forgotten += sum(forget(state, key, until=at) for state in list(self.ledger.states.values()))
        n = sum(counts.values())
        self.destroyed += n
        if n or forgotten:
            log.info("ledger_keys_destroyed", erasures=len(erasures), keys=n, records_forgotten=forgotten,
                     after_recovery=recovered)

    async def _destroy_keys(self, erasures: list[tuple[str, datetime]], recovered: bool) -> dict[str, int]:
        """Each erasure's keys: a member on an agent, an agent with its members, a member on every
        agent of the tenant, or every agent of the tenant. Live, every key the subject has now
        (a key's time comes from the clock of the process that made it, so a cutoff could spare
        one made just before the erasure); after a recovery, those made up to `RECOVERY_MARGIN`
        after it, so a member who came back since keeps the new keys."""
        keys = self.ledger.keys
        assert keys is not None  # called by `_destroyed`, with keys
        ring = keys.keyring
        by_tenant: defaultdict[str, list[str]] = defaultdict(list)
        for s in ring.subjects():
            by_tenant[tenant_of(s)].append(s)
        counts: dict[str, int] = {}
        for key, at in erasures:
            n = 0
            cutoff = at + RECOVERY_MARGIN if recovered else None
            for s in by_tenant[erasure_of(key)[0]]:
                if covers(key, s) and any(cutoff is None or r.created <= cutoff for r in ring.kids(s)):
                    n += await keys.destroy(s, before=cutoff)
            counts[key] = counts.get(key, 0) + n
        return counts
