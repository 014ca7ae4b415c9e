"""`VectorComputed.of` writes the bytes numpy's little-endian float32 would, whatever the vector's type."""

import base64

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.vectors import VectorComputed

FLOATS = st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=400)


def numpy_bytes(vector) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


@given(FLOATS)
def test_a_list_tuple_or_array_encodes_as_numpy_would(values):
    want = numpy_bytes(values)
    for vector in (values, tuple(values), np.asarray(values, dtype=np.float32), np.asarray(values, dtype=np.float64)):
        v = VectorComputed.of("m", "h", vector)
        assert base64.b64decode(v.dense_b64) == want
        assert v.dim == len(values)
        assert v.floats().tolist() == np.frombuffer(want, dtype="<f4").tolist()


def test_float64_values_round_to_float32_as_numpy_rounds():
    values = [0.1, 1 / 3, 1e-40, 3.4e38, -2.5e-7]
    assert base64.b64decode(VectorComputed.of("m", "h", values).dense_b64) == numpy_bytes(values)


def test_a_strided_numpy_row_is_read_by_value():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    column = rows[:, 1]  # not contiguous: its buffer is not the vector's bytes in order
    assert base64.b64decode(VectorComputed.of("m", "h", column).dense_b64) == numpy_bytes(column)


def test_a_vector_that_is_not_numbers_is_refused():
    with pytest.raises(TypeError):
        VectorComputed.of("m", "h", ["a", "b"])
