"""The contract's size limits: each refusal names its field and limit, and a command within
every limit makes events that fit the broker's message limit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from events import AddMemory, AgentConfig, ConfigureAgent, EditMemory, TurnOutcome
from events.codec import PLAIN, ContractError, decode, encode, from_validation_error
from events.limits import (
    COMMAND_LIMIT,
    EVENT_LIMIT,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    MAX_METADATA_KEYS,
    MAX_TURN_REF_CHARS,
    MESSAGE_LIMIT,
)
from events.record import MAX_CONTENT_BYTES, MAX_SUMMARY_BYTES, Provenance
from events.rules.ledger import LedgerState, decide, evolve
from services.errors import ApiError
from services.memory.commands import encoded

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def add(**kw) -> AddMemory:
    kw.setdefault("summary", "The sky is blue")
    return AddMemory(command_id="c1", tenant="t", agent="a", issued_at=NOW, session="s1", **kw)


def nested(depth: int) -> dict:
    v: dict = {}
    for _ in range(depth):
        v = {"k": v}
    return v


def refusal(**kw) -> ContractError:
    with pytest.raises(ValidationError) as e:
        add(**kw)
    return from_validation_error(e.value)


def test_metadata_over_its_byte_limit_is_refused_naming_field_and_limit():
    add(metadata={"blob": "m" * (MAX_METADATA_BYTES - 20)})
    err = refusal(metadata={"blob": "m" * 1_047_600})
    assert err.field == "metadata" and f"limit is {MAX_METADATA_BYTES} bytes" in str(err)
    # The same through the codec, as the ledger decodes a command from the log.
    raw = json.dumps({**json.loads(encode(add())), "metadata": {"blob": "m" * 20_000}})
    with pytest.raises(ContractError) as e:
        decode("memlane.memory.commands", raw)
    assert e.value.field == "metadata"


@pytest.mark.parametrize("depth", [MAX_METADATA_DEPTH + 1, 500, 5000])
def test_metadata_nested_too_deep_is_refused_without_recursing(depth):
    err = refusal(metadata=nested(depth))
    assert err.field == "metadata" and f"deeper than {MAX_METADATA_DEPTH} levels" in str(err)


def test_metadata_at_the_depth_limit_and_lists_count_as_levels():
    add(metadata=nested(MAX_METADATA_DEPTH))
    deep_list: list = []
    for _ in range(MAX_METADATA_DEPTH):
        deep_list = [deep_list]
    assert refusal(metadata={"l": deep_list}).field == "metadata"


def test_metadata_key_count_is_limited_across_levels():
    add(metadata={f"k{i}": i for i in range(MAX_METADATA_KEYS)})
    spread = {f"o{i}": {f"k{j}": j for j in range(20)} for i in range(MAX_METADATA_KEYS // 20 + 1)}
    err = refusal(metadata=spread)
    assert err.field == "metadata" and f"more than {MAX_METADATA_KEYS} keys" in str(err)


def test_metadata_with_a_lone_surrogate_is_a_validation_error():
    assert refusal(metadata={"x": "\ud800"}).field == "metadata"


def test_an_operator_edit_has_the_same_metadata_limits():
    with pytest.raises(ValidationError) as e:
        EditMemory(command_id="c1", tenant="t", agent="a", issued_at=NOW, record_id="r", metadata=nested(50))
    assert from_validation_error(e.value).field == "metadata"


def test_labels_are_limited_in_count_and_value_size():
    err = refusal(labels={f"l{i}": "v" for i in range(MAX_LABELS + 1)})
    assert err.field == "labels" and f"limit is {MAX_LABELS}" in str(err)
    err = refusal(labels={"team": "v" * (MAX_LABEL_VALUE_BYTES + 1)})
    assert err.field == "labels" and f"limit is {MAX_LABEL_VALUE_BYTES} bytes" in str(err)
    assert refusal(labels={"x" * 65: "v"}).field == "labels"


def test_a_label_refusal_never_names_the_label():
    """A label name can be a secret, and refusals are logged as CommandRejected events."""
    for labels in ({"sk-secret-name": "v" * (MAX_LABEL_VALUE_BYTES + 1)}, {"sk-secret-name": "\ud800"}):
        err = refusal(labels=labels)
        assert err.field == "labels" and "sk-secret-name" not in str(err)


def test_a_turn_reference_is_limited():
    assert refusal(turn_ref="t" * (MAX_TURN_REF_CHARS + 1)).field == "turn_ref"


def test_a_command_over_the_command_limit_is_refused_before_it_is_sent():
    big = add(provenance=Provenance(candidates=["c" * 1000] * 300))
    with pytest.raises(ApiError) as e:
        encoded(big, PLAIN)
    assert (e.value.status, e.value.code, e.value.field) == (413, "LIMIT_EXCEEDED", "provenance")
    assert f"limit of {COMMAND_LIMIT} bytes" in e.value.message
    assert encoded(add(), PLAIN) == encode(add())


def test_a_string_that_is_not_text_is_refused_naming_its_field():
    # Validation refuses lone surrogates in typed strings; this is the net under anything else.
    with pytest.raises(ApiError) as e:
        encoded(add().model_copy(update={"kind": "f\ud800"}), PLAIN)
    assert (e.value.status, e.value.field) == (422, "kind")


def test_the_limits_fit_the_broker_message_limit():
    assert COMMAND_LIMIT * 2 + 64 * 1024 < EVENT_LIMIT < MESSAGE_LIMIT <= 1_048_588


def test_the_largest_command_within_the_limits_makes_events_that_fit():
    """Worst cases for JSON escaping: control characters (6 bytes each) and quotes, in
    every field the events copy, and a staged write, which holds the command as a string."""
    labels = {f"l{n}": {"number": n} for n in range(5, 5 + MAX_LABELS)}
    ledger = LedgerState()
    evolve(ledger, decide(ledger, ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=NOW,
                                                 config=AgentConfig.model_validate({"memory": {"labels": labels}})))[0])
    metadata = {"x": "\x01" * (MAX_METADATA_BYTES // 6 - 10)}
    cmd = add(
        summary='"' * MAX_SUMMARY_BYTES,
        content="\x01" * MAX_CONTENT_BYTES,
        metadata=metadata,
        labels={f"l{n}": '"' * (MAX_LABEL_VALUE_BYTES // 2) for n in range(5, 5 + MAX_LABELS)},
        key="k" * 256,
        turn_ref="r" * MAX_TURN_REF_CHARS,
        provenance=Provenance(session="s1", modified_by="m" * 200),
    )
    assert len(encode(cmd)) <= COMMAND_LIMIT
    staged = decide(ledger, cmd)
    assert [e.type for e in staged] == ["WriteStaged"]
    evolve(ledger, staged[0])
    applied = decide(ledger, TurnOutcome(command_id="o", tenant="t", agent="a", issued_at=NOW,
                                         turn_ref=cmd.turn_ref, committed=True))
    assert [e.type for e in applied] == ["TurnResolved", "RecordAdded"]
    assert max(len(encode(e)) for e in [*staged, *applied]) <= EVENT_LIMIT
