"""A shard opens with memlane's current Edge settings, whenever it was made."""

from __future__ import annotations

import json

from projections.qdrant import edge_shard


def test_a_shard_made_before_search_threads_were_set_opens_with_them(tmp_path, monkeypatch):
    path = tmp_path / "shard"
    current = edge_shard.EdgeConfig
    with monkeypatch.context() as m:  # the settings as they were before `max_search_threads`
        m.setattr(edge_shard, "EdgeConfig", lambda max_search_threads, **rest: current(**rest))
        edge_shard.open_shard(path, 4, "agent").close()
    assert "max_search_threads" not in json.loads((path / "edge_config.json").read_text())

    edge_shard.open_shard(path, 4, "agent").close()

    assert json.loads((path / "edge_config.json").read_text())["max_search_threads"] == edge_shard.SEARCH_THREADS
