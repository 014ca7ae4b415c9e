"""Recall's facts keep their place when episodes or procedures match its query better: a
search of their own (score fusion ranks a kind that matches word for word by the hundred
ahead of the rest)."""

from __future__ import annotations

import pytest

from events.config import AgentConfig
from tests.unit.test_reads_subjects import Reads, agent, rec

CFG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]},
                                            "search": {"mode": "lexical", "max_results": 2}}})


@pytest.fixture
async def s(tmp_path):
    reads = Reads(tmp_path, CFG)
    yield reads
    reads.index.close()


async def test_facts_crowded_out_of_one_search_by_episodes_are_recalled(s):
    await s.put(*[rec(f"ep{i}", f"Episode {i}: the deploy freeze, the deploy freeze again", None, i, kind="episode")
                  for i in range(8)])
    await s.put(rec("fact", "A deploy needs the owner's sign-off", None, 20))
    # One search alone: its page of 4 (twice max_results) is episodes only.
    alone = await s.reads.search(agent(None), query="deploy freeze", limit=4)
    assert [r.kind for r, _ in alone.records] == ["episode"] * 4
    res = await s.reads.recall(agent(None), "conv", "deploy freeze")
    assert [r.id for r, _ in res.records] == ["fact"]
    assert res.episodes and all(r.kind == "episode" for r in res.episodes)


async def test_recall_searches_facts_and_the_consolidated_kinds_each_in_its_own_part(s, monkeypatch):
    await s.put(rec("ep", "Episode: the deploy freeze", None, 1, kind="episode"),
                rec("proc", "Procedure: thaw a deploy freeze", None, 2, kind="procedure"),
                rec("f1", "The deploy freeze starts Friday", None, 3), rec("f2", "A deploy needs sign-off", None, 4))
    searches = []
    real = s.index.search
    monkeypatch.setattr(s.index, "search", lambda f, *a, **kw: searches.append((f.kinds, f.not_kinds)) or real(f, *a, **kw))
    res = await s.reads.recall(agent(None), "conv", "deploy freeze")
    assert sorted(r.id for r, _ in res.records) == ["f1", "f2"]
    assert [r.id for r in res.episodes] == ["ep"] and [r.id for r in res.procedures] == ["proc"]
    assert searches == [((), ("episode", "procedure")), (("episode", "procedure"), ())]


async def test_the_facts_format_searches_facts_only(s, monkeypatch):
    s.configure(AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]},
                                                       "search": {"mode": "lexical", "max_results": 2},
                                                       "recall": {"format": "facts"}}}))
    await s.put(rec("ep", "Episode: the deploy freeze", None, 1, kind="episode"),
                rec("f1", "The deploy freeze starts Friday", None, 3))
    searches = []
    real = s.index.search
    monkeypatch.setattr(s.index, "search", lambda f, *a, **kw: searches.append(f.not_kinds) or real(f, *a, **kw))
    res = await s.reads.recall(agent(None), "conv", "deploy freeze")
    assert [r.id for r, _ in res.records] == ["f1"] and res.episodes == []
    assert searches == [("episode", "procedure")]


async def test_the_facts_block_shows_every_live_fact_the_most_relevant_first(s):
    """The facts format renders every live fact, not `search.max_results` of them: the ones the
    query ranks first, then the rest, newest first; a fact that does not fit is left out whole."""
    s.configure(AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]},
                                                       "search": {"mode": "lexical", "max_results": 2},
                                                       "recall": {"format": "facts"}}}))
    await s.put(*[rec(f"f{i}", f"Unrelated fact number {i}", None, i) for i in range(8)],
                rec("match", "The deploy freeze starts Friday", None, 1))
    res = await s.reads.recall(agent(None), "conv", "deploy freeze")
    ids = [r.id for r, _ in res.records]
    assert ids[0] == "match" and sorted(ids[1:]) == [f"f{i}" for i in range(8)]
    assert ids[1:] == [f"f{i}" for i in reversed(range(8))]  # newest first
    assert all(f"Unrelated fact number {i}" in res.rendered for i in range(8))
