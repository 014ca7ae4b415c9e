"""The pure parts of reading the past: how `as_of` is read, and which facts held at a time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.record import MemoryRecord
from services.memory.past import holds_at
from workers.followers.past_memory import Point

T = datetime(2026, 3, 1, tzinfo=UTC)


def test_as_of_is_a_time_with_its_offset_or_a_log_position():
    assert Point.parse("2026-03-01T00:00:00Z") == Point(at=T)
    assert Point.parse("2026-03-01T02:00:00+02:00").at == T
    assert Point.parse("1200") == Point(position=1200)
    assert Point.parse("3:1200") == Point(position=1200, partition=3)  # as X-Memlane-Position reports it
    with pytest.raises(ValueError, match="offset from UTC"):
        Point.parse("2026-03-01T00:00:00")
    with pytest.raises(ValueError, match="as_of: a time such as"):
        Point.parse("last tuesday")


def fact(valid_from: datetime | None, valid_to: datetime | None) -> MemoryRecord:
    return MemoryRecord(id="r", version=1, created=T, modified=T, tenant="t", agent="a", scope="AGENT", kind="fact",
                        summary="Dana lives in Porto", valid_from=valid_from, valid_to=valid_to)


def test_a_fact_holds_from_its_valid_from_until_its_valid_to():
    jan, feb, apr = (datetime(2026, m, 1, tzinfo=UTC) for m in (1, 2, 4))
    assert holds_at(fact(None, None), T)
    assert holds_at(fact(feb, apr), T) and holds_at(fact(T, None), T)
    assert not holds_at(fact(apr, None), T)  # not yet
    assert not holds_at(fact(jan, feb), T) and not holds_at(fact(jan, T), T)  # no longer, from valid_to on
