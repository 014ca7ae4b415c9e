"""One suite for the vector-index port: Qdrant Edge, qdrant-client local mode, and a
Qdrant server when QDRANT_URL is set."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events.record import MemoryRecord
from projections.embedders.onnx import OnnxMiniLM
from projections.qdrant import ranking
from projections.qdrant.client_index import ClientIndex
from projections.qdrant.index import EdgeIndex, SearchFilter

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EMBEDDER = OnnxMiniLM()
ADAPTERS = ["edge", "client-local"] + (["server"] if os.environ.get("QDRANT_URL") else [])


@pytest.fixture(params=ADAPTERS)
def index(request, tmp_path):
    if request.param == "edge":
        idx = EdgeIndex(tmp_path / "shard")
    elif request.param == "client-local":
        idx = ClientIndex.connect(None, "memory", path=str(tmp_path / "local"))
    else:
        idx = ClientIndex.connect(os.environ["QDRANT_URL"], f"contract_{uuid.uuid4().hex[:8]}")
    yield idx
    idx.close()


def rec(rid, summary, minute=0, **kw):
    base = dict(id=rid, version=1, created=T0 + timedelta(minutes=minute), modified=T0, tenant="t", agent="a",
                scope="AGENT", kind="fact", summary=summary)
    base.update(kw)
    return MemoryRecord(**base)


def put(index, *records):
    vecs = EMBEDDER.embed([r.text for r in records])
    index.upsert(list(zip(records, vecs)))


def flt(**kw):
    base = dict(tenant="t", agent="a", scopes=("AGENT", "SESSION"), session="s1", preview=False)
    base.update(kw)
    return SearchFilter(**base)


def search(index, text, mode="hybrid", f=None, limit=5, min_score=0.0):
    dense = None if mode == "lexical" else EMBEDDER.embed([text])[0]
    return [h.record_id for h in index.search(f or flt(), dense, text, limit, mode, min_score)]


def test_modes_find_identifiers_and_paraphrases(index):
    put(index, rec("id", "Ticket INC-40417 was escalated"), rec("para", "The customer is furious about the late parcel"),
        rec("other", "Quarterly revenue grew"))
    assert search(index, "INC-40417", "lexical")[0] == "id"
    assert search(index, "client angry delivery delayed", "vector")[0] == "para"
    assert search(index, "client angry delivery delayed", "lexical") == []
    assert search(index, "INC-40417")[0] == "id"
    assert search(index, "client angry delivery delayed")[0] == "para"
    assert search(index, "client angry delivery delayed", "vector", min_score=0.95) == []


def test_hybrid_ranks_by_the_fused_scores_of_the_lexical_and_the_dense_list(index):
    put(index, rec("deploy", "The deploy freeze starts Friday at noon"), rec("window", "Release window is Friday"),
        rec("owner", "Kestrel owns the deploy runbook"), rec("lunch", "Lunch is at noon on Fridays"),
        rec("budget", "The budget review moved to March"), rec("cal", "Calendar invites go out on Monday"))
    text = "when does the deploy freeze start"
    dense = EMBEDDER.embed([text])[0]
    # Each list alone, deep enough to hold every record, then the rule by hand.
    lexical = index.search(flt(), None, text, 20, "lexical")
    nearest = index.search(flt(), dense, text, 20, "vector")
    expected = ranking.fused_keys({h.record_id: h.score for h in lexical}, {h.record_id: h.score for h in nearest})
    got = index.search(flt(), dense, text, 3, "hybrid")
    assert {h.record_id: h.score for h in got} == pytest.approx({k: expected[k] for k in [h.record_id for h in got]})
    assert [h.record_id for h in got] == sorted(expected, key=lambda k: -expected[k])[:3]
    assert got[0].record_id == "deploy" and got[0].score == pytest.approx(1.0)  # the best of both lists


def test_a_record_said_inside_the_window_the_question_names_is_lifted(index):
    day = timedelta(days=1)
    put(index, rec("early", "We decided the deploy freeze starts Friday", observed_at=T0),
        rec("later", "We decided the deploy freeze starts Monday", observed_at=T0 + 5 * day),
        rec("recorded", "We decided the deploy freeze starts Sunday", minute=3 * 24 * 60))  # said when recorded
    text, dense = "what did we decide about the deploy freeze", EMBEDDER.embed(["what did we decide about the deploy freeze"])[0]
    plain = {h.record_id: h.score for h in index.search(flt(), dense, text, 5)}
    ms = lambda t: int(t.timestamp() * 1000)  # noqa: E731
    for inside, at in (("early", T0), ("later", T0 + 5 * day), ("recorded", T0 + 3 * day)):
        got = index.search(flt(), dense, text, 5, window=(ms(at), ms(at + day)))
        assert got[0].record_id == inside
        scores = {h.record_id: h.score for h in got}
        assert scores[inside] == pytest.approx(plain[inside] + ranking.TIME_WEIGHT)
        assert all(scores[k] == pytest.approx(plain[k]) for k in scores if k != inside)
    # Only hybrid search ranks by it.
    assert index.search(flt(), None, text, 5, "lexical", window=(ms(T0), ms(T0 + day)))[0].score == pytest.approx(
        index.search(flt(), None, text, 5, "lexical")[0].score)


def test_filters_isolate_agent_session_preview_kind_and_labels(index):
    put(index,
        rec("mine", "shared fact alpha"),
        rec("other-agent", "shared fact alpha", agent="b"),
        rec("other-tenant", "shared fact alpha", tenant="u"),
        rec("s2", "shared fact alpha", scope="SESSION", session="s2"),
        rec("s1", "shared fact alpha", scope="SESSION", session="s1", kind="event", labels={"customer": "42"}),
        rec("draft", "shared fact alpha", preview=True))
    assert sorted(search(index, "alpha", "lexical", limit=10)) == ["mine", "s1"]
    assert sorted(search(index, "alpha", "lexical", flt(preview=True), limit=10)) == ["draft", "mine", "s1"]
    assert search(index, "alpha", "lexical", flt(kind="event")) == ["s1"]
    assert search(index, "alpha", "lexical", flt(labels=(("customer", "42"),))) == ["s1"]
    assert search(index, "alpha", "lexical", flt(scopes=("AGENT",))) == ["mine"]
    assert search(index, "alpha", "lexical", flt(scopes=())) == []


def test_a_tag_filter_keeps_records_holding_every_tag_and_never_matches_a_label(index):
    put(index,
        rec("both", "shared fact beta", tags=["billing", "q3"]),
        rec("one", "shared fact beta", tags=["billing"]),
        rec("label", "shared fact beta", labels={"#billing": "x"}),
        rec("none", "shared fact beta"))
    assert sorted(search(index, "beta", "lexical", flt(tags=("billing",)), limit=10)) == ["both", "one"]
    assert search(index, "beta", "lexical", flt(tags=("billing", "q3")), limit=10) == ["both"]
    assert search(index, "beta", "lexical", flt(labels=(("#billing", "x"),)), limit=10) == ["label"]


def test_ties_at_the_cut_are_kept_and_upsert_replaces(index):
    put(index, rec("old", "alpha code red", minute=1), rec("new", "alpha code blue", minute=2))
    # Equal scores: a point keeps no age, so both come back even past the limit, and the
    # memory service orders them (newer first) once it has the records.
    assert sorted(search(index, "alpha", "lexical", limit=1)) == ["new", "old"]
    put(index, rec("old", "beta only now", minute=1, version=2))
    assert search(index, "alpha", "lexical") == ["new"]
    assert index.count() == 2


def test_delete_and_shadow(index):
    put(index, rec("live", "gamma fact"), rec("gone", "gamma fact too"))
    index.delete([("t", "a", "gone")])
    assert search(index, "gamma", "lexical") == ["live"]
    index.set_shadowed("t", "a", "live", True)
    assert search(index, "gamma", "lexical", flt(preview=True)) == []
    assert search(index, "gamma", "lexical") == ["live"]


def test_an_optimized_index_still_answers_each_agent_alone(index):
    """Without a global graph (m=0), optimize() must leave every agent searchable, large or small."""
    big = [rec(f"big{i}", f"Order {i} shipped to warehouse {i % 7}", minute=i) for i in range(300)]
    small = [rec("small1", "Order 12 shipped to warehouse 5", agent="b")]
    put(index, *big, *small)
    index.optimize()
    assert search(index, "Order 12 shipped to warehouse 5")[0] == "big12"
    assert search(index, "Order 12 shipped to warehouse 5", "vector", f=flt(agent="b")) == ["small1"]


def test_equal_record_ids_of_two_agents_are_two_points(index):
    """A point is named by tenant, agent and record id: a record of another tenant or agent
    with the same id neither replaces it nor, deleted or shadowed, takes it along."""
    put(index, rec("same", "delta fact of t/a"), rec("same", "delta fact of u/a", tenant="u"),
        rec("same", "delta fact of t/b", agent="b"))
    assert index.count() == 3
    index.delete([("u", "a", "same")])
    index.set_shadowed("t", "b", "same", True)
    assert search(index, "delta", "lexical") == ["same"]
    assert search(index, "delta", "lexical", flt(preview=True)) == ["same"]
    assert search(index, "delta", "lexical", flt(tenant="u")) == []
    assert search(index, "delta", "lexical", flt(agent="b", preview=True)) == []


def test_record_ids_lists_one_agents_points_page_by_page(index, monkeypatch):
    import projections.qdrant.client_index as client_module
    import projections.qdrant.index as edge_module

    monkeypatch.setattr(edge_module, "SCROLL_PAGE", 2)
    monkeypatch.setattr(client_module, "SCROLL_PAGE", 2)
    put(index, *[rec(f"r{i}", f"epsilon {i}") for i in range(5)], rec("theirs", "epsilon", agent="b"),
        rec("r0", "epsilon", tenant="u"))
    assert index.record_ids("t", "a") == {f"r{i}" for i in range(5)}
    assert index.record_ids("t", "b") == {"theirs"}
    assert index.record_ids("t", "nobody") == set()


def test_two_users_user_records_never_reach_each_others_search(index):
    """A USER record reaches its member only: another member, a search naming no member,
    and a search without the USER scope never match it, in any mode."""
    put(index,
        rec("ann1", "favourite colour is teal", scope="USER", user="ann"),
        rec("ann2", "prefers short answers in teal", scope="USER", user="ann", kind="profile"),
        rec("bob1", "favourite colour is teal", scope="USER", user="bob"),
        rec("shared", "the team colour is teal"),
        rec("s1", "teal session note", scope="SESSION", session="s1"),
        rec("ann-b", "teal on agent b", scope="USER", user="ann", agent="b"),
        rec("ann-u", "teal in tenant u", scope="USER", user="ann", tenant="u"))
    users = ("AGENT", "SESSION", "USER")
    for mode in ("lexical", "vector", "hybrid"):
        assert sorted(search(index, "teal colour", mode, flt(scopes=users, user="ann"), limit=10)) == \
            ["ann1", "ann2", "s1", "shared"]
        assert sorted(search(index, "teal colour", mode, flt(scopes=users, user="bob"), limit=10)) == \
            ["bob1", "s1", "shared"]
        # No member named, or USER not a readable scope: no one's USER records.
        assert sorted(search(index, "teal colour", mode, flt(scopes=users), limit=10)) == ["s1", "shared"]
        assert sorted(search(index, "teal colour", mode, flt(scopes=("AGENT",), user="ann"), limit=10)) == ["shared"]
    assert search(index, "teal", "lexical", flt(scopes=("USER",), user="ann", kind="profile")) == ["ann2"]
    # The same member on another agent or in another tenant is another subject.
    assert search(index, "teal", "lexical", flt(scopes=users, user="ann", agent="b")) == ["ann-b"]
    assert search(index, "teal", "lexical", flt(scopes=users, user="ann", tenant="u")) == ["ann-u"]
    # By id: a guessed id of the other member's record is not a hit.
    assert search(index, "teal", "lexical", flt(scopes=users, user="bob", ids=("ann1", "bob1"))) == ["bob1"]


def test_an_index_that_cannot_search_says_so(index, request):
    """A failed index raises `IndexUnavailable` (what a recall answers with an empty block),
    not whatever its storage or client raised."""
    from qdrant_client import QdrantClient

    from projections.qdrant.index import IndexUnavailable

    put(index, rec("r1", "zeta fact"))
    if request.node.callspec.params["index"] == "server":
        index.client = QdrantClient(url="http://127.0.0.1:1")  # nothing listens there
    else:
        index.close()
    for mode in ("lexical", "vector", "hybrid"):
        with pytest.raises(IndexUnavailable):
            search(index, "zeta", mode)
    if isinstance(index, ClientIndex):  # a server that cannot be reached
        index.client = QdrantClient(url="http://127.0.0.1:1")
        with pytest.raises(IndexUnavailable):
            search(index, "zeta", "hybrid")


def test_purge_removes_every_point_of_an_erased_subject_and_nothing_else(index):
    """A member on one agent: their USER records there, and the records of other scopes made
    from their turns; on every agent of the tenant; an agent; a tenant. The same member on
    another agent or tenant, other members, and records naming no member stay."""
    from projections.records import Erasure

    def member(rid, user, **kw):
        return rec(rid, f"omega {rid}", scope="USER", user=user, **kw)

    put(index, member("ann1", "ann"), member("ann2", "ann", kind="profile"), member("bob1", "bob"),
        rec("shared", "omega shared"), rec("ann-said", "omega said", user="ann"),  # agent scope, made from ann's turn
        rec("ann-sess", "omega sess", scope="SESSION", session="s1", user="ann"),
        member("ann-b", "ann", agent="b"), rec("b-shared", "omega b", agent="b"),
        member("ann-tb", "ann", tenant="tb"), member("ann-u", "ann", tenant="u"), rec("u1", "omega u", tenant="u"))
    everyone = ("AGENT", "SESSION", "USER")

    def found(user, **kw):
        return sorted(search(index, "omega", "lexical", flt(scopes=everyone, user=user, **kw), limit=20))

    for _ in range(2):  # idempotent
        index.purge(Erasure("t", "a", "ann"))
        assert found("ann") == ["shared"] and found("bob") == ["bob1", "shared"]
        assert found("ann", agent="b") == ["ann-b", "b-shared"]
    index.purge(Erasure("t", None, "ann"))
    assert found("ann", agent="b") == ["b-shared"] and found("bob") == ["bob1", "shared"]
    assert found("ann", tenant="tb") == ["ann-tb"]  # "t/" is not a prefix of "tb/"
    index.purge(Erasure("t", "a", None))
    assert found("bob") == [] and found("bob", agent="b") == ["b-shared"]
    index.purge(Erasure("t", None, None))
    assert found("bob", agent="b") == [] and found("ann", tenant="tb") == ["ann-tb"]
    assert found("ann", tenant="u") == ["ann-u", "u1"]
    assert index.count() == 3


def test_a_point_holds_no_personal_field():
    """The payload names ids, scope, kind and labels; the text stays in the vectors."""
    from projections.qdrant.index import payload_of

    r = rec("r1", "Dana's locker code is 4411", content="at the heron gym", key="locker", labels={"topic": "gym"},
            metadata={"note": "private"})
    assert "4411" not in str(payload_of(r)) and "heron" not in str(payload_of(r))
    assert "private" not in str(payload_of(r)) and "locker" not in str(payload_of(r))


# ---------------------------------------------------------------------- collections and aliases

COLLECTIONS = ["client-local"] + (["server"] if os.environ.get("QDRANT_URL") else [])


@pytest.fixture(params=COLLECTIONS)
def collections(request, tmp_path):
    from projections.qdrant.client_index import Collections

    prefix = f"contract{uuid.uuid4().hex[:8]}."
    if request.param == "server":
        cols = Collections(os.environ["QDRANT_URL"], prefix, tmp_path / "state",
                           api_key=os.environ.get("QDRANT_API_KEY"))
    else:
        cols = Collections(None, prefix, tmp_path / "state", local_root=tmp_path / "local")
    yield cols
    for gen in cols.generations():
        cols.drop(gen)


def aliases(cols) -> dict[str, str]:
    with cols.catalog() as c:
        return {a.alias_name: a.collection_name for a in c.get_aliases().aliases if a.alias_name.startswith(cols.prefix)}


def test_a_generation_is_a_collection_per_shard_and_keeps_its_shard_count(collections):
    assert collections.generations() == {} and collections.live() is None
    assert collections.ensure(1, 2) == 2
    assert collections.ensure(1, 4) == 2  # made with two shards, it keeps two
    assert collections.ensure(2, 3) == 3
    assert collections.generations() == {1: 2, 2: 3}
    # Each shard is a collection of its own: a point in one is in no other.
    for gen, k, text in ((1, 0, "kappa in g1 s0"), (2, 0, "kappa in g2 s0")):
        idx = collections.open(gen, k)
        try:
            put(idx, rec(f"g{gen}", text))
        finally:
            idx.close()
    for gen, k, want in ((1, 0, ["g1"]), (1, 1, []), (2, 0, ["g2"]), (2, 2, [])):
        idx = collections.open(gen, k)
        try:
            assert search(idx, "kappa", "lexical") == want, (gen, k)
        finally:
            idx.close()


def test_a_switch_moves_every_shards_alias_at_once_and_drops_the_extra_ones(collections):
    collections.ensure(1, 2)
    collections.ensure(2, 3)
    collections.switch(1)
    assert collections.live() == 1
    assert aliases(collections) == {collections.alias(k): collections.name(1, k) for k in range(2)}
    collections.switch(2)
    assert collections.live() == 2
    assert aliases(collections) == {collections.alias(k): collections.name(2, k) for k in range(3)}
    # Back to fewer shards: the third shard's alias goes, none names a generation not live.
    collections.switch(1)
    assert aliases(collections) == {collections.alias(k): collections.name(1, k) for k in range(2)}
    with pytest.raises(ValueError):
        collections.switch(7)  # no such generation: the aliases stay
    assert collections.live() == 1


def test_dropping_a_generation_removes_its_collections_and_checkpoints(collections):
    collections.ensure(1, 2)
    collections.ensure(2, 2)
    collections.switch(2)
    idx = collections.open(1, 0)
    put(idx, rec("r1", "lambda fact"))
    ckpt = idx.path.parent / f"{idx.path.name}.checkpoint.json"
    idx.close()
    ckpt.write_text("{}")
    collections.drop(1)
    assert collections.generations() == {2: 2} and not ckpt.exists()
    assert collections.live() == 2
    # A generation made again after a drop starts empty.
    assert collections.ensure(1, 2) == 2
    idx = collections.open(1, 0)
    try:
        assert idx.count() == 0
    finally:
        idx.close()


def test_every_filter_field_has_a_payload_index_and_owner_is_the_tenant_index(tmp_path, monkeypatch):
    """Whatever a search filters on is indexed (a server in strict mode refuses unindexed
    filters), and `owner` is the tenant index, with prefix matching for a tenant's erasure."""
    from qdrant_client import QdrantClient

    from projections.qdrant.index import filter_terms

    made: dict[str, object] = {}
    real = QdrantClient.create_payload_index

    def record(self, collection_name, field_name, field_schema=None, **kw):
        made[field_name] = field_schema
        return real(self, collection_name, field_name, field_schema, **kw)

    monkeypatch.setattr(QdrantClient, "create_payload_index", record)
    ClientIndex.connect(None, "memory", path=str(tmp_path / "local")).close()
    everything = flt(scopes=("AGENT", "SESSION", "USER"), user="ann", kind="fact", labels=(("a", "b"),),
                     ids=("r1",))
    for preview in (False, True):
        must, must_not = filter_terms(SearchFilter(**{**everything.__dict__, "preview": preview}))
        assert {k for k, _ in must + must_not} <= set(made), set(made)
    assert made["owner"].is_tenant and made["owner"].prefix
    assert not any(getattr(made[f], "is_tenant", False) for f in made if f != "owner")
