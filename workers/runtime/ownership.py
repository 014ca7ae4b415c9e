"""When a worker's commits are refused because it no longer owns its work: which errors say so,
its transactional id, and when it stops rejoining and gives up (`Fenced`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    InvalidProducerEpoch,
    ProducerFenced,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

# Errors that say a commit was refused because this worker no longer owns what it committed:
# a newer producer took its transactional id (or the coordinator timed its transaction out),
# or its consumer group rebalanced without it. Another try, from the committed offsets, is due.
FENCES = (ProducerFenced, InvalidProducerEpoch)
LOST_OWNERSHIP = (*FENCES, CommitFailedError, IllegalGenerationError, UnknownMemberIdError, RebalanceInProgressError)
# A worker rejoins at most this many times within the window, then exits: a second live process
# with the same transactional id fences it on every try, and the two would take turns forever.
REJOIN_LIMIT = 3
REJOIN_WINDOW_S = 300.0


def transactional_id(group: str, instance: str, fresh: Callable[[], str] = lambda: uuid.uuid4().hex[:8]) -> str:
    """A transactional worker's id: its consumer group, which carries the deployment's group and
    topic prefixes, and its instance, so that a restart of the same instance fences its dead
    predecessor and aborts the transaction it left open. No instance: a `fresh` random one, which
    fences nothing and is never shared."""
    return f"{group}.{instance or fresh()}"


def lost_ownership(e: BaseException | None) -> BaseException | None:
    """The ownership error in `e` or in what caused it (the producer wraps some), if any."""
    while e is not None:
        if isinstance(e, LOST_OWNERSHIP):
            return e
        e = e.__cause__
    return None


def too_many_rejoins(earlier: Sequence[float], now: float, limit: int = REJOIN_LIMIT,
                     window_s: float = REJOIN_WINDOW_S) -> bool:
    """Whether a worker that rejoined at the `earlier` times should give up instead at `now`."""
    return sum(now - t < window_s for t in earlier) >= limit


class Fenced(RuntimeError):
    """The worker kept losing its commits' ownership: it exits rather than take turns with whatever
    takes it (a live duplicate of its transactional id, most likely)."""


def fenced_text(worker: str, refusals: int, lost: BaseException, instance: str, txn_id: str | None) -> str:
    """Why a worker refused `refusals` times gives up, and what the operator can do about it."""
    head = f"worker {worker}: commits refused {refusals} times within {REJOIN_WINDOW_S:g} s ({type(lost).__name__})"
    if not isinstance(lost, FENCES):
        return f"{head}: its consumer group keeps rebalancing without it (does its group session expire?)"
    if instance:
        return (f"{head}: another live process likely uses its transactional id {txn_id!r}; "
                "give each replica its own MEMLANE_WORKER_INSTANCE")
    return f"{head}: the coordinator keeps aborting its transactions (do they outlast MEMLANE_TRANSACTION_TIMEOUT_MS?)"
