"""LongMemEval_S questions as memlane history: each question's haystack is one agent's session,
each haystack session a run of it (its `execution_id`), each pair of messages a turn timed by
its session's date. A message's id is `<haystack session>:<index>`, so a hit names its session.

Read from the data directory beside the repository (`DATA`), never copied here. Tuning is on the questions whose id
sorts into even positions, validation on the odd ones (the data's README)."""

from __future__ import annotations

import gzip
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from events import Message, TurnCommitted
from events.rules import named_time
from settings import ROOT

DATA = ROOT.parent / "shared" / "data" / "longmemeval" / "lme_s_dev.json.gz"
KS = (5, 10, 25)
# The measures the benches print, by their figure names.
REPORTED = {**{f"turn@{k}": f"turn_recall_at_{k}" for k in KS},
            "session_all@5": "session_recall_all_at_5",
            "evidence_session_all@5": "evidence_session_recall_all_at_5",
            "message_session_all@5": "session_recall_all_at_5_top_5_messages"}


def load() -> list[dict[str, Any]]:
    return json.load(gzip.open(DATA))


def split(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    ids = sorted(x["question_id"] for x in items)
    tune = {q for i, q in enumerate(ids) if i % 2 == 0}
    return {"tuning": [x for x in items if x["question_id"] in tune],
            "validation": [x for x in items if x["question_id"] not in tune]}


def haystack_time(s: str) -> datetime:
    return datetime.strptime(re.sub(r" \(\w+\)", "", s), "%Y/%m/%d %H:%M").replace(tzinfo=UTC)


def asked_at(item: dict[str, Any]) -> datetime:
    return haystack_time(item["question_date"])


def named_window(item: dict[str, Any]) -> tuple[int, int] | None:
    """The window the question names, read against the time it was asked (Unix ms)."""
    w = named_time.window(item["question"], asked_at(item))
    return None if w is None else w.ms()


def message_id(session_id: str, index: int) -> str:
    return f"{session_id}:{index}"


def session_of(mid: str) -> str:
    return mid.rsplit(":", 1)[0]


def last_message_id(item: dict[str, Any]) -> str:
    """The haystack's last message: searchable once the whole haystack is indexed."""
    return message_id(item["haystack_session_ids"][-1], len(item["haystack_sessions"][-1]) - 1)


def evidence(item: dict[str, Any]) -> set[str]:
    return {message_id(sid, i) for sid, msgs in zip(item["haystack_session_ids"], item["haystack_sessions"], strict=True)
            for i, m in enumerate(msgs) if m.get("has_answer")}


def turns(item: dict[str, Any], tenant: str, agent: str) -> list[TurnCommitted]:
    """The haystack as turn events of one session (the question's id)."""
    out: list[TurnCommitted] = []
    for sid, date, msgs in zip(item["haystack_session_ids"], item["haystack_dates"], item["haystack_sessions"],
                               strict=True):
        start = haystack_time(date)
        for i in range(0, len(msgs), 2):
            out.append(TurnCommitted(
                event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session=item["question_id"],
                turn=len(out) + 1, execution_id=sid, occurred_at=start + timedelta(seconds=i),
                messages=[Message(id=message_id(sid, i + j), role=m["role"], content=m["content"] or " ")
                          for j, m in enumerate(msgs[i:i + 2])]))
    return out


def first_sessions(ranked: list[str], k: int) -> set[str]:
    """The first k distinct sessions the ranking names, as LongMemEval's own evaluation reads a
    ranking of turns as one of sessions (it widens the cut until k sessions are in it)."""
    return set(list(dict.fromkeys(session_of(m) for m in ranked))[:k])


def scores(ranked: list[str], item: dict[str, Any]) -> dict[str, float]:
    """turn recall@k (share of the evidence messages in the top k) and session recall_all@k
    (every answer session among the first k sessions the ranking names), for k in KS.
    `evidence_session_all@k` counts only the answer sessions holding an evidence message, as
    LongMemEval's own evaluation does: a few questions name answer sessions where no message is
    marked. `message_session_all@k` is the stricter reading: every answer session among the
    sessions of the top k messages."""
    ev, answer_sessions = evidence(item), set(item["answer_session_ids"])
    out = {}
    for k in KS:
        top = ranked[:k]
        sessions = first_sessions(ranked, k)
        out[f"turn@{k}"] = len(ev & set(top)) / len(ev) if ev else float("nan")
        out[f"session_all@{k}"] = float(answer_sessions <= sessions)
        out[f"evidence_session_all@{k}"] = float({session_of(m) for m in ev} <= sessions)
        out[f"message_session_all@{k}"] = float(answer_sessions <= {session_of(m) for m in top})
    return out
