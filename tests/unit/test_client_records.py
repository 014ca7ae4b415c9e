"""The client package's record model reads what the server's record holds: it names every field
the server's `MemoryRecord` has (a new server field would otherwise reach clients untyped), and
its provenance fields are the server's."""

from __future__ import annotations

from datetime import UTC, datetime

from memlane_client import Provenance as ClientProvenance
from memlane_client import Record

from events.record import MemoryRecord, Provenance, Scope


def test_the_client_record_names_the_servers_fields():
    assert set(Record.model_fields) == set(MemoryRecord.model_fields) - {"schema_version"}
    assert set(ClientProvenance.model_fields) <= set(Provenance.model_fields)


def test_a_server_record_reads_back_whole_in_the_client_model():
    at = datetime(2026, 3, 1, tzinfo=UTC)
    r = MemoryRecord(id="r1", version=2, created=at, modified=at, tenant="t", agent="a", scope=Scope.USER, user="u",
                     kind="fact", summary="Dana lives in Porto", labels={"city": "porto"}, valid_from=at)
    back = Record.model_validate(r.model_dump(mode="json"))
    assert (back.id, back.scope, back.user, back.labels, back.valid_from) == ("r1", "USER", "u", {"city": "porto"}, at)
