"""Reading an `/embeddings` answer: base64 or lists, in input order, sizes checked."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from projections.embedders.openai_api import vectors_of


def b64(v) -> str:
    return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()


def test_rows_come_back_in_input_order_whatever_their_encoding():
    resp = {"data": [{"index": 1, "embedding": [0.0, 1.0, 2.0]}, {"index": 0, "embedding": b64([3.0, 4.0, 5.0])}]}
    assert vectors_of(resp, 2, 3).tolist() == [[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]


@pytest.mark.parametrize(
    ("resp", "message"),
    [
        ({"data": [{"index": 0, "embedding": [1.0, 2.0]}]}, "has 2 dimensions; the index needs 3"),
        ({"data": [{"index": 0, "embedding": b64([1.0] * 4)}]}, "has 4 dimensions; the index needs 3"),
        ({"data": []}, "has 0 rows in data; 1 texts were sent"),
        ({"error": "nope"}, "has no rows in data"),
        ({"data": [{"index": 5, "embedding": [1.0, 2.0, 3.0]}]}, "index 5 is not one of 0..0"),
        ({"data": ["oops"]}, "row is a JSON str, not an object"),
    ],
)
def test_a_malformed_answer_is_refused_saying_what_is_wrong(resp, message):
    with pytest.raises(ValueError, match=message):
        vectors_of(resp, 1, 3)


def test_an_index_given_twice_is_refused():
    row = {"index": 0, "embedding": [1.0, 2.0, 3.0]}
    with pytest.raises(ValueError, match="comes twice"):
        vectors_of({"data": [row, row]}, 2, 3)
