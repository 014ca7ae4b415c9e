"""The event contract: round-trips, and refusals that name the field."""

from datetime import UTC, datetime

import pytest

from events import (
    AddMemory,
    ContractError,
    Message,
    RecordAdded,
    RecordDeleted,
    SessionEnded,
    ToolCall,
    TurnCommitted,
    TurnRolledBack,
    decode,
    encode,
)
from events.record import MemoryRecord
from events.topics import TOPICS

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def turn(**kw):
    base = dict(
        event_id="e1",
        tenant="t",
        agent="a",
        session="s",
        turn=3,
        attempt=2,
        execution_id="x1",
        invocation=1,
        agent_version=7,
        preview=True,
        occurred_at=NOW,
        messages=[
            Message(id="m1", role="user", content="hi"),
            Message(
                id="m2",
                role="assistant",
                tool_calls=[ToolCall(id="c1", name="add_memory", arguments={"summary": "x"})],
            ),
            Message(id="m3", role="tool", tool_call_id="c1", tool_name="add_memory", content="ok", is_error=False),
        ],
    )
    base.update(kw)
    return TurnCommitted(**base)


def record(**kw):
    base = dict(
        id="r1", version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope="AGENT", kind="fact", summary="s"
    )
    base.update(kw)
    return MemoryRecord(**base)


@pytest.mark.parametrize(
    "topic,message",
    [
        ("memlane.turns", turn()),
        ("memlane.turns", TurnRolledBack(event_id="e2", tenant="t", agent="a", turn=1, execution_id="x", occurred_at=NOW)),
        ("memlane.turns", SessionEnded(event_id="e3", tenant="t", agent="a", session="s", occurred_at=NOW)),
        ("memlane.memory.commands", AddMemory(command_id="c", tenant="t", agent="a", issued_at=NOW, summary="x")),
        ("memlane.memory.events", RecordAdded(event_id="v", command_id="c", tenant="t", agent="a", occurred_at=NOW, record=record())),
        ("memlane.memory.events", RecordDeleted(event_id="v", command_id="c", tenant="t", agent="a", occurred_at=NOW, record=record(status="DELETED", version=2))),
    ],
)
def test_round_trip(topic, message):
    back = decode(topic, encode(message))
    assert back == message
    assert back.type == message.type
    assert back.schema_version == 1


def test_models_are_frozen():
    from pydantic import ValidationError

    t = turn()
    with pytest.raises(ValidationError, match="frozen"):
        t.turn = 4  # type: ignore[misc]


def test_unknown_type_is_refused_naming_type():
    with pytest.raises(ContractError) as e:
        decode("memlane.turns", b'{"type": "TurnExploded", "tenant": "t"}')
    assert e.value.field == "type"
    assert "TurnExploded" in str(e.value)


def test_missing_field_is_named():
    raw = turn().model_dump(mode="json")
    del raw["execution_id"]
    import json

    with pytest.raises(ContractError) as e:
        decode("memlane.turns", json.dumps(raw))
    assert e.value.field == "execution_id"


def test_nested_bad_field_is_named_with_its_path():
    raw = turn().model_dump(mode="json")
    raw["messages"][1]["role"] = "robot"
    import json

    with pytest.raises(ContractError) as e:
        decode("memlane.turns", json.dumps(raw))
    assert e.value.field == "messages.1.role"


def test_oversize_summary_names_field_and_limit():
    raw = AddMemory(command_id="c", tenant="t", agent="a", issued_at=NOW, summary="x").model_dump(mode="json")
    raw["summary"] = "é" * 300  # 600 bytes in UTF-8, 300 characters
    import json

    with pytest.raises(ContractError) as e:
        decode("memlane.memory.commands", json.dumps(raw))
    assert e.value.field == "summary"
    assert "600 bytes" in str(e.value) and "512" in str(e.value)


def test_oversize_content_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        record(content="x" * (16 * 1024 + 1))
    assert "content" in str(e.value) and "16384" in str(e.value)


def test_unknown_field_is_refused():
    raw = turn().model_dump(mode="json")
    raw["colour"] = "blue"
    import json

    with pytest.raises(ContractError) as e:
        decode("memlane.turns", json.dumps(raw))
    assert e.value.field == "colour"


def test_not_json_is_refused():
    with pytest.raises(ContractError) as e:
        decode("memlane.memory.events", b"\x00garbage")
    assert e.value.field == "$"


def test_topic_registry_keys():
    t = turn()
    assert TOPICS["memlane.turns"].key(t) == "t/a/s"
    assert TOPICS["memlane.memory.commands"].key(t) == "t/a"
    assert TOPICS["memlane.memory.events"].partitions == TOPICS["memlane.memory.commands"].partitions
    assert TOPICS["memlane.vectors"].compacted


def test_turn_ref_distinguishes_attempts():
    assert turn(attempt=1).turn_ref != turn(attempt=2).turn_ref
