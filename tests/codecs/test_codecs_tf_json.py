"""TF Serving's JSON mapping: decoding requests, encoding responses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from servekit.codecs import json as jsonc
from servekit.codecs import tf_json
from servekit.errors import BadRequest


def test_row_format_unnamed_numeric():
    inputs, row = tf_json.decode_predict_request({"instances": [[1, 2], [3, 4]]})
    assert row is True
    assert inputs.dtype == np.int64 and inputs.shape == (2, 2)


def test_row_format_named_inputs_share_batch_dimension():
    body = {
        "instances": [
            {"tag": "foo", "signal": [1, 2, 3], "sensor": [[1, 2], [3, 4]]},
            {"tag": "bar", "signal": [3, 4, 1], "sensor": [[4, 5], [6, 8]]},
        ]
    }
    inputs, _ = tf_json.decode_predict_request(body)
    assert inputs["tag"].tolist() == ["foo", "bar"]
    assert inputs["signal"].shape == (2, 3)
    assert inputs["sensor"].shape == (2, 2, 2)


def test_columnar_format_named_and_unnamed():
    inputs, row = tf_json.decode_predict_request({"inputs": {"a": [1.5, 2.5], "b": [[1], [2], [3]]}})
    assert row is False and inputs["a"].dtype == np.float64 and inputs["b"].shape == (3, 1)
    single, _ = tf_json.decode_predict_request({"inputs": [1.0, 2.0]})
    assert single.tolist() == [1.0, 2.0]


def test_b64_values_decode_to_bytes():
    inputs, _ = tf_json.decode_predict_request({"instances": [{"b64": "aW1hZ2UgYnl0ZXM="}, {"b64": "eA=="}]})
    assert inputs.tolist() == [b"image bytes", b"x"]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"instances": [[1, 2], [3]]}, "ragged"),
        ({"instances": [1, "a"]}, "mixes"),
        ({"instances": [None]}, "null"),
        ({"instances": [{"a": 1}, {"b": 2}]}, "same inputs"),
        ({"instances": [1], "inputs": [1]}, "both"),
        ({}, "neither"),
        ({"instances": 5}, "must be a list"),
        ({"instances": [{"b64": "!!"}]}, "invalid base64"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_requests_are_rejected_with_a_message(body, message):
    with pytest.raises(BadRequest, match=message):
        tf_json.decode_predict_request(body)


def test_nan_and_infinity_tokens_round_trip():
    body = jsonc.loads(b'{"instances": [1.0, NaN, Infinity, -Infinity]}')
    values = tf_json.to_tensor(body["instances"], "instances")
    assert math.isnan(values[1]) and values[2] == math.inf and values[3] == -math.inf
    out = jsonc.dumps(tf_json.encode_predict_response(values, True))
    assert out == b'{"predictions":[1.0,NaN,Infinity,-Infinity]}'


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        np.float64("inf"),
        np.float32("-inf"),
        np.array([[1.0, np.nan]]),
        [1, "a", True, [2.5, float("inf")]],
        (0.5, -math.inf),
    ],
    ids=["float", "np.float64", "np.float32", "array", "nested list", "tuple"],
)
def test_a_non_finite_value_anywhere_in_an_answer_is_written_as_a_token_not_null(value):
    doc = {"model_name": "m", "outputs": [{"name": "y", "shape": [1], "data": value, "parameters": {"n": 1}}]}
    text = jsonc.dumps(doc).decode()
    assert "null" not in text and ("NaN" in text or "Infinity" in text), text


def test_a_finite_answer_goes_through_orjson_unchanged():
    doc = {"a": [1, 2.5, "x", None, True, b"b"], "b": (np.float64(1.5), np.array([1.0, 2.0]))}
    assert jsonc.loads(jsonc.dumps(doc)) == {"a": [1, 2.5, "x", None, True, "b"], "b": [1.5, [1.0, 2.0]]}


def test_single_named_output_drops_its_name_and_bytes_outputs_are_b64():
    assert tf_json.encode_predict_response({"y": np.array([1.0])}, True) == {"predictions": np.array([1.0])}
    out = tf_json.encode_predict_response({"img_bytes": np.array([b"\x00\x01"], dtype=object)}, False)
    assert out == {"outputs": [{"b64": "AAE="}]}


def test_several_outputs_become_rows_or_columns():
    outputs = {"a": np.array([1, 2]), "b": np.array([[1.0, 2.0], [3.0, 4.0]])}
    rows = jsonc.loads(jsonc.dumps(tf_json.encode_predict_response(outputs, True)))
    assert rows == {"predictions": [{"a": 1, "b": [1.0, 2.0]}, {"a": 2, "b": [3.0, 4.0]}]}
    cols = jsonc.loads(jsonc.dumps(tf_json.encode_predict_response(outputs, False)))
    assert cols == {"outputs": {"a": [1, 2], "b": [[1.0, 2.0], [3.0, 4.0]]}}


def test_examples_merge_context_and_reject_clashes():
    examples = tf_json.decode_examples({"context": {"c": 1}, "examples": [{"x": 1.5}, {"x": [2, 3]}]})
    assert examples == [{"c": [1], "x": [1.5]}, {"c": [1], "x": [2, 3]}]
    with pytest.raises(BadRequest, match="context"):
        tf_json.decode_examples({"context": {"x": 1}, "examples": [{"x": 2}]})
