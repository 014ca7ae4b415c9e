"""Member profiles' pure rules (docs/features/profiles.md): the ledger's writes, versions, consent and
who may write, enrichment within the limit, erasure, the fold from the ledger's own view, the
snapshot, sealing under the member's key, and consolidation's enrichment command."""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime

import pytest

from events import AgentConfig, SessionEnded, codec
from events.commands import (
    PROFILE_CHARS,
    ConfigureAgent,
    DeleteProfile,
    EnrichProfile,
    EraseSubject,
    GrantConsent,
    RemoveAgent,
    SetProfile,
    WithdrawConsent,
)
from events.lean import decode_ledger_view
from events.record import Provenance, Source
from events.rules import consolidation
from events.rules.ledger import LedgerState, evolve, forget
from events.rules.ledger.profiles import enriched, profile_of
from events.sealing import subject_of
from projections.redis.profile_view import Profile
from services.auth import Principal
from services.errors import ApiError
from services.memory.context import Context
from services.memory.profiles import check_access, layer_entries
from tests.unit.test_ledger_rules import NOW, Ledger, nid, only
from workers.processors.ledger.snapshot_file import decode_state, encode_state

MEMBER, AGENT, OPERATOR = (Provenance(source=s) for s in (Source.MEMBER, Source.TOOL, Source.OPERATOR))
CONSOLIDATION = Provenance(source=Source.CONSOLIDATION)


def set_profile(led, text, user="u1", provenance=AGENT, **kw):
    return led.run(SetProfile(command_id=nid(), tenant="t", agent="a", issued_at=kw.pop("issued_at", NOW), user=user,
                              text=text, provenance=provenance, **kw))


def delete_profile(led, user="u1", provenance=AGENT, **kw):
    return led.run(DeleteProfile(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user=user,
                                 provenance=provenance, **kw))


def enrich(led, lines, user="u1", provenance=CONSOLIDATION, command_id=None):
    return led.run(EnrichProfile(command_id=command_id or nid(), tenant="t", agent="a", issued_at=NOW, user=user,
                                 lines=lines, provenance=provenance))


def grant(led, user="u1"):
    return led.run(GrantConsent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user=user, provenance=MEMBER))


def test_a_profile_is_written_whole_with_a_version_and_a_stale_version_is_refused():
    led = Ledger()
    e = only(set_profile(led, "Prefers metric units", expected_version=0), "ProfileChanged")
    assert (e.user, e.text, e.version) == ("u1", "Prefers metric units", 1)
    assert only(set_profile(led, "Prefers metric units\nVegetarian", expected_version=1), "ProfileChanged").version == 2
    e = only(set_profile(led, "Lost update", expected_version=1), "CommandRejected")
    assert (e.code, e.field) == ("VERSION_CONFLICT", "expected_version") and "at version 2, not 1" in e.reason
    assert profile_of(led.state, "t/a", "u1") == (2, "Prefers metric units\nVegetarian")  # nothing changed
    assert profile_of(led.state, "t/a", "u2") == (0, "")  # another member's is their own
    assert only(set_profile(led, "Prefers metric units\nVegetarian"), "ProfileChanged").version == 2  # the same text


def test_a_deleted_profile_is_gone_and_its_versions_never_repeat():
    led = Ledger()
    set_profile(led, "Likes jazz")
    e = only(delete_profile(led, expected_version=1), "ProfileChanged")
    assert (e.text, e.version) == ("", 2)
    assert only(delete_profile(led), "CommandRejected").code == "NOT_FOUND"
    assert only(set_profile(led, "Stale", expected_version=1), "CommandRejected").code == "VERSION_CONFLICT"
    assert only(set_profile(led, "Likes blues", expected_version=0), "ProfileChanged").version == 3


def test_who_may_write_a_profile_and_what_needs_consent():
    led = Ledger(consent="required")
    e = only(set_profile(led, "No consent yet"), "CommandRejected")
    assert (e.code, e.field) == ("CONSENT_REQUIRED", "user")
    assert only(set_profile(led, "No consent yet", provenance=MEMBER), "CommandRejected").code == "CONSENT_REQUIRED"
    grant(led)
    only(set_profile(led, "Written by the agent for u1"), "ProfileChanged")
    only(set_profile(led, "Written by u1", provenance=MEMBER.model_copy(update={"user": "u1"})), "ProfileChanged")
    e = only(set_profile(led, "An operator's words", provenance=OPERATOR), "CommandRejected")
    assert (e.code, e.field) == ("FORBIDDEN", "user")
    e = only(set_profile(led, "u2 writing u1's", provenance=MEMBER.model_copy(update={"user": "u2"})),
             "CommandRejected")
    assert e.code == "FORBIDDEN"
    e = only(enrich(led, ["Likes tea"], provenance=AGENT), "CommandRejected")
    assert (e.code, e.field) == ("FORBIDDEN", "lines")
    assert only(set_profile(led, "x", preview=True), "CommandRejected").code == "PREVIEW_READ_ONLY"
    led.run(WithdrawConsent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user="u1", provenance=MEMBER))
    assert only(set_profile(led, "After withdrawal"), "CommandRejected").code == "CONSENT_REQUIRED"
    assert only(delete_profile(led), "CommandRejected").code == "CONSENT_REQUIRED"  # the agent's delete
    assert only(delete_profile(led, provenance=OPERATOR), "ProfileChanged").text == ""  # an operator's needs none
    e = only(led.run(SetProfile(command_id=nid(), tenant="t", agent="a", issued_at=NOW, text="nobody's")),
             "CommandRejected")
    assert (e.code, e.field) == ("VALIDATION_FAILED", "user")


def test_enrichment_appends_new_lines_and_never_cuts_the_members_words():
    assert enriched("Likes tea", ["likes  TEA", "Vegetarian", "Vegetarian"]) == ("Likes tea\nVegetarian", 1, 2)
    full = "x" * (PROFILE_CHARS - 6)
    assert enriched(full, ["Too long", "Short"]) == (full + "\nShort", 1, 1)  # 6 characters: "\nShort" fits
    assert enriched("", ["First"]) == ("First", 1, 0)
    led = Ledger(profiles={"enrich": True})
    e = only(enrich(led, ["Prefers email", "Prefers email"]), "ProfileChanged")
    assert (e.text, e.version, e.added, e.skipped) == ("Prefers email", 1, 1, 1)
    e = only(enrich(led, ["prefers EMAIL"]), "ProfileChanged")
    assert (e.version, e.added) == (1, 0)  # nothing new: the same version
    set_profile(led, "y" * PROFILE_CHARS)
    e = only(enrich(led, ["Likes trains"]), "ProfileChanged")
    assert (e.text, e.skipped) == ("y" * PROFILE_CHARS, 1)


def test_a_redelivered_enrichment_appends_once():
    led = Ledger(profiles={"enrich": True})
    first = enrich(led, ["Prefers email"], command_id="enrich-s1")
    assert [e.type for e in first] == ["ProfileChanged"]
    # The worker answers a command id it has seen with its first events; decided again, the
    # same lines are in the profile already and add nothing.
    again = only(enrich(led, ["Prefers email"], command_id="enrich-s1"), "ProfileChanged")
    assert (again.added, again.version) == (0, 1)


def test_enrichment_is_checked_where_it_applies_and_never_brings_back_a_deleted_profile():
    led = Ledger()  # enrichment off: a consolidation that started when it was on writes nothing
    e = only(enrich(led, ["Prefers email"]), "CommandRejected")
    assert (e.code, e.field) == ("FORBIDDEN", "memory.profiles.enrich")
    led = Ledger(profiles={"enrich": True})
    set_profile(led, "Likes jazz")
    delete_profile(led, provenance=MEMBER.model_copy(update={"user": "u1"}))
    assert only(enrich(led, ["Prefers email"]), "CommandRejected").code == "NOT_FOUND"
    assert profile_of(led.state, "t/a", "u1") == (2, "")


def test_with_memory_off_the_member_and_the_operator_still_delete_a_profile():
    led = Ledger()
    set_profile(led, "Likes jazz")
    led.run(ConfigureAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW,
                           config=AgentConfig.model_validate({"memory": {"enabled": False}})))
    assert only(set_profile(led, "Likes blues"), "CommandRejected").code == "MEMORY_DISABLED"
    assert only(delete_profile(led), "CommandRejected").code == "MEMORY_DISABLED"  # the agent's own
    e = only(delete_profile(led, provenance=MEMBER.model_copy(update={"user": "u1"})), "ProfileChanged")
    assert (e.text, e.version) == ("", 2)


def test_erasure_and_removal_forget_the_profile_and_the_fold_reads_the_ledgers_view():
    led = Ledger()
    set_profile(led, "u1's profile")
    set_profile(led, "u2's profile", user="u2")
    led.run(EraseSubject(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user="u1", provenance=OPERATOR))
    assert profile_of(led.state, "t/a", "u1") == (0, "") and profile_of(led.state, "t/a", "u2")[1] == "u2's profile"
    led.run(RemoveAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, provenance=OPERATOR))
    assert dict(led.state.profiles) == {}
    # Recovery folds the `LedgerView` of each event: the same state as the contract event.
    e = only(set_profile(Ledger(), "From the log"), "ProfileChanged")
    state = LedgerState()
    evolve(state, decode_ledger_view(codec.encode(e)))
    assert profile_of(state, "t/a", "u1") == (1, "From the log")


def test_forgetting_until_a_time_keeps_a_profile_written_later():
    led = Ledger()
    set_profile(led, "Before", issued_at=NOW)
    set_profile(led, "After", user="u2", issued_at=datetime(2027, 1, 1, tzinfo=UTC))
    forget(led.state, "t/*|u:u1", until=NOW)
    forget(led.state, "t/*|u:u2", until=NOW)
    assert profile_of(led.state, "t/a", "u1") == (0, "") and profile_of(led.state, "t/a", "u2") == (1, "After")


def test_profile_text_is_sealed_under_the_members_key_in_events_commands_and_snapshots(keyring, sealing):
    led = Ledger()
    e = only(set_profile(led, "CANARY vegetarian"), "ProfileChanged")
    raw = sealing.encode(e)
    assert b"CANARY" not in raw and sealing.decode("memlane.memory.events", raw).text == "CANARY vegetarian"
    cmd = SetProfile(command_id="c", tenant="t", agent="a", issued_at=NOW, user="u1", text="CANARY cmd")
    assert b"CANARY" not in sealing.encode(cmd)
    assert keyring.kids(subject_of("t", "a", "u1"))  # the member's key sealed them
    body = encode_state(led.state, OrderedDict(), c=keyring)
    assert b"CANARY" not in body
    state, _, dropped = decode_state(body, keyring)
    assert dropped == 0 and dict(state.profiles) == dict(led.state.profiles)
    for rec in keyring.kids(subject_of("t", "a", "u1")):
        keyring.apply(rec.topic_key, None)  # the member's erasure destroys their keys
    state, _, dropped = decode_state(body, keyring)
    assert dropped == 1 and dict(state.profiles) == {}


def test_a_snapshot_without_a_cipher_keeps_profiles_as_they_are():
    led = Ledger()
    set_profile(led, "Plain")
    state, _, _ = decode_state(encode_state(led.state, OrderedDict()))
    assert profile_of(state, "t/a", "u1") == (1, "Plain")


def _ctx(role, user=None, agent="a"):
    return Context(Principal("t", agent, role, user=user if role == "member" else None), agent, user=user)


def test_who_may_reach_a_profile_through_the_api():
    check_access(_ctx("member", "u1"), "u1", "write")
    check_access(_ctx("agent", "u1"), "u1", "read")
    check_access(_ctx("operator"), "u1", "delete")
    for ctx, action, code in [
        (_ctx("member", "u2"), "read", "FORBIDDEN"),
        (_ctx("agent", "u2"), "read", "FORBIDDEN"),
        (_ctx("agent"), "read", "VALIDATION_FAILED"),
        (_ctx("operator"), "read", "FORBIDDEN"),
        (_ctx("operator"), "write", "FORBIDDEN"),
        (_ctx("helper", "u1"), "write", "READ_ONLY_KEY"),
    ]:
        with pytest.raises(ApiError) as err:
            check_access(ctx, "u1", action)
        assert err.value.code == code, (ctx, action)


def test_the_recall_layer_shows_the_profile_without_the_members_id_in_its_text():
    assert layer_entries(None) == {}
    [entry] = layer_entries(Profile("u1", "Vegetarian", 3))["User profile"]
    assert (entry.id, entry.title, entry.text) == ("profile", "Profile", "Vegetarian")
    assert entry.as_json() == {"id": "profile", "title": "Profile", "text": "Vegetarian", "user": "u1", "version": 3}


def _ended(user="u1"):
    return SessionEnded(event_id="end-1", tenant="t", agent="a", session="s1", execution_id="x", outcome="successful",
                        occurred_at=NOW, user=user)


def _answer(*facts):
    return consolidation.ConsolidationAnswer(outcome="successful", success_score=0.9, summary="Did it",
                                             facts=[consolidation.Fact(summary=s, kind=k) for s, k in facts])


@pytest.mark.parametrize("enrich_on", [True, False])
def test_consolidation_enriches_the_profile_with_preference_facts_when_configured(enrich_on):
    cfg = AgentConfig.model_validate({"memory": {"kinds": ["fact", "preference"], "scope": {
        "read": ["user"], "write": ["user"]}, "profiles": {"enrich": enrich_on}}})
    answer = _answer(("Prefers the metric system", "preference"), ("The office is in Lyon", "fact"),
                     ("Prefers the\nmetric   system", "preference"))
    made = consolidation.to_commands(_ended(), cfg, answer, [], "m")
    enrichments = [c for c in made.commands if isinstance(c, EnrichProfile)]
    if not enrich_on:
        assert enrichments == []
        return
    [e] = enrichments
    assert e.lines == ["Prefers the metric system"] and e.user == "u1"
    assert e.provenance.source is Source.CONSOLIDATION
    again = consolidation.to_commands(_ended(), cfg, answer, [], "m")
    assert [c.command_id for c in again.commands] == [c.command_id for c in made.commands]  # a replay: same ids
    assert not [c for c in consolidation.to_commands(_ended(None), cfg, answer, [], "m").commands
                if isinstance(c, EnrichProfile)]  # no member: no profile


def test_a_config_without_profiles_reads_as_enrichment_off():
    assert AgentConfig.model_validate(json.loads('{"memory": {}}')).memory.profiles.enrich is False
