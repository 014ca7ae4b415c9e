"""Tenant conventions: which facts count, when two facts are "the same", and the command a
candidate makes (docs/features/tenant-platform-memory.md). Pure; the conventions worker
(`workers.processors.conventions`) keeps the agents seen per fact key in Redis and sends the commands.

Which facts count: a fact an agent established for itself, live, of agent scope, written with
no member named and not in a preview. A member's user-scope facts and session-scope records
never leave their agent (they are personal, or a conversation's), and neither do episodes and
procedures (consolidation's retellings, not facts).

"The same fact": the same key (`fact_key`): the set of content words of the fact's text as the
near-duplicate merge compares them (`events.rules.near_duplicate.content_words`: lower case,
punctuation, stopwords and word forms ignored), with its numbers and whether it negates. So a
restatement the exact-merge rule would merge (`normalized_hash`: case, punctuation and spacing)
always has the same key, and so has one that only differs in stopwords or word forms ("The deploy
runs on Fridays" / "deploys run on friday"). A paraphrase in other words is not the same fact
here: the worker has no embedder, and an exact key makes the candidate deterministic and its
state one Redis set per key (a pairwise word-overlap test would compare each fact with every
other of the tenant, and give different candidates in a different order).
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Any

from events.commands import SHARED_TEXT_CHARS, WORKSPACE, ProposeConvention
from events.record import Provenance, Scope, Source, Status
from events.rules.near_duplicate import content_words, negated, numbers, word_overlap

NAMESPACE = uuid.UUID("0e4c5a55-3a4e-4f5e-9a5c-5d7b0c1e2f31")
NOT_FACTS = ("episode", "procedure")  # consolidation's retellings (events.rules.ledger.state.RESERVED_KINDS)
MAX_CONVENTIONS = 5  # approved conventions in one recall, those sharing most words with its text


def qualifies(record: Any, agent: str) -> bool:
    """Whether a record (a `RecordAdded`'s) counts toward a convention: see the module doc."""
    return (
        agent != WORKSPACE
        and not agent.startswith("@")
        and record.scope is Scope.AGENT
        and record.user is None
        and not record.preview
        and record.status is Status.ACTIVE
        and record.kind not in NOT_FACTS
        and record.provenance.source != Source.MEMBER  # a lean record's source is its string
    )


def fact_key(summary: str, content: str = "") -> str | None:
    """The key two texts share when they state the same fact (module doc); None for a text with
    no content word, which is no fact to share."""
    text = f"{summary} {content}".strip()
    words = content_words(text)
    if not words:
        return None
    canon = " ".join(sorted(words)) + f"|n:{','.join(sorted(numbers(text)))}|neg:{int(negated(text))}"
    return hashlib.sha256(canon.encode()).hexdigest()[:32]


def convention_text(summary: str) -> str:
    """What the candidate says: the first agent's summary, within the shared layers' limit."""
    return summary if len(summary) <= SHARED_TEXT_CHARS else summary[: SHARED_TEXT_CHARS - 1] + "…"


MAX_NAMED = 1000  # agents a proposal names (`ProposeConvention.agents` takes no more)


def propose(tenant: str, key: str, text: str, agents: set[str] | frozenset[str], at: datetime) -> ProposeConvention:
    """The command for a fact seen in `agents` (two or more). Its id names the tenant, the key
    and how many agents were seen, so a replay sends the same command (the ledger's recent
    commands answer it) and the ledger's rule ignores a proposal it holds already."""
    # The command names at most MAX_NAMED agents (the first by id): past that many the fact is
    # the tenant's beyond doubt, and the proposal stays the same command however many more come.
    named = sorted(agents)[:MAX_NAMED]
    cid = str(uuid.uuid5(NAMESPACE, f"{tenant}|{key}|{len(named)}"))
    return ProposeConvention(
        command_id=f"convention:{cid}", tenant=tenant, agent=WORKSPACE, issued_at=at,
        provenance=Provenance(source=Source.CONSOLIDATION, modified_by="conventions"),
        convention=key, text=convention_text(text), agents=named,
    )


def rank(entries: list[Any], text: str, limit: int = MAX_CONVENTIONS) -> list[Any]:
    """The approved conventions a recall shows, at most `limit`: those sharing most content
    words with its text first (`word_overlap`), then the others, ties by id so the order is
    stable."""
    scored = sorted(entries, key=lambda e: (-word_overlap(e.text, text), e.id))
    return scored[:limit]
