"""Embeds session history: each part of a committed turn's kept events (`events.rules.history`,
the rules the history projection folds by) goes to the compacted `memlane.history.vectors`,
named by its point id and sealed under its turn's subject, in its turn's partition.

The API's history projection only joins and indexes them, so more workers in this group
share history's embedding, and a history rebuild embeds nothing (docs/decisions/0005-history-bypasses-the-ledger.md). A
rolled-back attempt keeps nothing, so it has no vector; an erasure tombstones the subject's
history vectors, and a turn from before an erasure this worker has seen is not embedded.

It runs beside the record embedding worker, in that worker's process but in a consumer group
and transactions of its own: a long message's parts never hold up a record's vector, which
search waits for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from events.codec import PLAIN, Codec
from events.lean import decode_lean
from events.rules.history import erased, erasure_marker, kept_events, parts_of
from events.sealing import subject_of
from events.topics import EVENTS, HISTORY_VECTORS, TURNS
from events.turns import TurnCommitted
from events.vectors import VectorComputed
from projections.embedders.port import Embedder
from projections.records import Erasure, erasure_at
from workers.processors.embedding import doomed
from workers.runtime.metrics import MeteredEmbedder
from workers.runtime.runner import Out, Processor

log = structlog.get_logger()


class HistoryEmbeddingProcessor(Processor):
    name = "history-embedding"
    sources = (TURNS.name, EVENTS.name)  # events for the erasures alone
    # A turn's parts wait this long for more: the record the turn causes is embedded on a core
    # of its own meanwhile (search waits for it; history's searches come later), and under load
    # parts of one length from several turns share a call.
    gather_ms = 50

    def __init__(self, settings, embedder: Embedder, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        self.embedder = MeteredEmbedder(embedder, "worker")
        # (point id, turn partition) -> (text, subject): the batch's parts to embed.
        self.parts: dict[tuple[str, int], tuple[str, str]] = {}
        self.erasures: list[Erasure] = []  # the batch's
        # Erasure markers seen (events.rules.history.erased): a turn folded after one, from
        # before it, is not embedded again under its member's new key.
        self.erased_at: dict[str, int] = {}

    def decode_message(self, source: str, message: Any) -> Any:
        if source == TURNS.name:
            return PLAIN.decode(source, message.value)  # the platform's turns are plaintext
        if b"SubjectErased" not in message.value:
            return None  # the only event this worker acts on; the rest is not decoded
        e = decode_lean(message.value)
        return e if e.type == "SubjectErased" else None

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if isinstance(event, TurnCommitted):  # a rollback or a session's end keeps nothing
            for e in kept_events(event):
                if not erased(self.erased_at, e):
                    subject = subject_of(e.tenant, e.agent, e.user)
                    for pid, _, _, text in parts_of(e):
                        self.parts[pid, partition] = (text, subject)
        elif source == EVENTS.name and event is not None:  # `decode_message` keeps erasures alone
            er, at = erasure_at(event.full(self.codec))
            self.erasures.append(er)
            marker = erasure_marker(er.tenant, er.agent, er.user)
            self.erased_at[marker] = max(at, self.erased_at.get(marker, -1))
        return []

    async def batch_done(self) -> list[Out]:
        """The batch's parts embedded in one call, each distinct text once, in a thread: a batch
        of long messages takes seconds, and the group's heartbeats go on. The tombstones of
        erased subjects' history vectors go first, in every partition (a subject's sessions
        spread over them)."""
        outs: list[Out] = []
        if self.erasures:
            erasures, self.erasures = self.erasures, []
            outs = await doomed(self.settings, HISTORY_VECTORS, list(range(HISTORY_VECTORS.partitions)), erasures)
            if outs:
                log.info("history_vectors_tombstoned", vectors=len(outs), erasures=len(erasures))
        if not self.parts:
            return outs
        parts, self.parts = self.parts, {}
        texts = list(dict.fromkeys(text for text, _ in parts.values()))
        by_text = dict(zip(texts, await asyncio.to_thread(self.embedder.embed, texts), strict=True))
        for (pid, partition), (text, subject) in parts.items():
            msg = VectorComputed.of(self.embedder.model_id, pid, by_text[text], subject, self.codec.cipher)
            outs.append(Out(HISTORY_VECTORS.name, HISTORY_VECTORS.key_bytes(msg), self.codec.encode(msg), partition=partition))
        log.info("history_vectors_sent", embedded=len(texts), sent=len(outs), model=self.embedder.model_id)
        return outs
