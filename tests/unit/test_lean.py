"""Lean views agree with the full contract on what projections read, and refuse what it refuses."""

from datetime import UTC, datetime

import numpy as np
import pytest

from events import ContractError, RecordAdded, RecordPinned, VectorComputed, encode
from events.codec import PLAIN
from events.lean import decode_lean, decode_lean_vector
from events.memory import TurnResolved
from events.record import MemoryRecord

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def record(**kw) -> MemoryRecord:
    base = dict(id="r1", version=2, created=NOW, modified=NOW, tenant="t", agent="a", scope="SESSION", session="s",
                kind="fact", summary="sum", content="body", labels={"team": "x"}, expires_at=NOW, pinned=True,
                replaces="r0", preview=True)
    return MemoryRecord(**(base | kw))


@pytest.mark.parametrize("cls", [RecordAdded, RecordPinned])
def test_lean_record_event_keeps_every_projected_field_and_the_raw_bytes(cls):
    full = cls(event_id="e", command_id="c", tenant="t", agent="a", occurred_at=NOW, record=record(), last=False)
    raw = encode(full)
    lean = decode_lean(raw)
    assert (lean.type, lean.command_id, lean.last, lean.raw) == (full.type, "c", False, raw)
    for name in set(lean.record.__struct_fields__) - {"sealed", "provenance"}:
        assert getattr(lean.record, name) == getattr(full.record, name), name
    for name in lean.record.provenance.__struct_fields__:  # the run a record came from, for the ledger
        assert getattr(lean.record.provenance, name) == getattr(full.record.provenance, name), name
    assert lean.record.text == full.record.text
    assert lean.full(PLAIN) == full


def test_lean_event_without_a_record():
    e = TurnResolved(event_id="e", command_id="c", tenant="t", agent="a", occurred_at=NOW, turn_ref="x", committed=True)
    lean = decode_lean(encode(e))
    assert lean.record is None and lean.type == "TurnResolved"


@pytest.mark.parametrize(
    "raw,field",
    [
        (b'{"type": "Bogus", "command_id": "c"}', "type"),
        (b'{"type": "RecordAdded", "command_id": "c"}', "record"),  # a record event needs its record
        (b'{"type": "TurnResolved"}', "command_id"),
        (b'{"type": "RecordAdded", "command_id": "c", "record": {"id": "r"}}', "record.version"),
        (b'{"type": "RecordAdded", "command_id": "c", "record": {"id": "r", "version": "two"}}', "record.version"),
        (b"{not json", "$"),
    ],
)
def test_lean_decoding_refuses_what_the_contract_refuses(raw, field):
    with pytest.raises(ContractError) as e:
        decode_lean(raw)
    assert e.value.field == field


def test_lean_vector_decodes_the_same_floats():
    vec = np.random.default_rng(3).standard_normal(384).astype(np.float32)
    v = VectorComputed.of("m", "h", vec)
    lean = decode_lean_vector(encode(v))
    assert (lean.model, lean.content_hash) == ("m", "h")
    assert lean.floats(None) == v.floats()
    assert np.allclose(np.frombuffer(lean.floats(None).tobytes(), dtype=np.float32), vec)
