import uuid

from events.ids import uuid5


def test_uuid5_spells_the_standard_library_s_name_based_id():
    ns = uuid.UUID("5b0c2f57-3c2e-4a43-9d63-0f1d8f3a9a11")
    for name in ["", "a", "record:t/a/c", "x" * 300, "ünïcode/ø#3"]:
        assert uuid5(ns, name) == str(uuid.uuid5(ns, name))
