"""The V2 codec against tritonclient's own serialisation: every datatype, JSON and binary."""

from __future__ import annotations

import json

import numpy as np
import pytest
from servekit.codecs import v2
from servekit.errors import BadRequest, ModelFailure
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]


def sample(datatype: str) -> np.ndarray:
    dtype = v2.V2_TO_NUMPY[datatype]
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    return np.array([[info.min, 0, 1], [2, 3, info.max]], dtype=dtype)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_round_trip_matches_tritonclient_layout(datatype):
    arr = sample(datatype)
    raw = v2.tensor_to_bytes(arr)
    assert raw == arr.tobytes()  # tritonclient's set_data_from_numpy sends tobytes()
    back = v2.tensor_from_bytes(datatype, [2, 3], raw)
    assert back.dtype == arr.dtype and back.shape == (2, 3)
    np.testing.assert_array_equal(back, arr)
    assert back.flags.writeable  # a model may change its inputs in place
    assert np_to_triton_dtype(arr.dtype) == datatype == v2.datatype_of(arr)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_round_trip_keeps_extremes(datatype):
    arr = sample(datatype)
    data = json.loads(json.dumps(v2.tensor_to_json(arr).tolist()))
    back = v2.tensor_from_json(datatype, [2, 3], data)
    assert back.dtype == arr.dtype
    np.testing.assert_array_equal(back, arr)


def test_binary_shares_a_writable_buffer():
    body = bytearray(np.arange(4, dtype=np.float32).tobytes())
    arr = v2.tensor_from_bytes("FP32", [2, 2], memoryview(body))
    body[0:4] = np.float32(9).tobytes()
    assert arr[0, 0] == 9  # no copy was made


def test_bytes_binary_is_tritonclients_length_prefixed_layout():
    arr = np.array([[b"ab", b""], [b"\xff\x00z", b"text"]], dtype=object)
    raw = v2.tensor_to_bytes(arr)
    assert raw == serialize_byte_tensor(arr).item()
    back = v2.tensor_from_bytes("BYTES", [2, 2], raw)
    assert back.tolist() == arr.tolist()
    np.testing.assert_array_equal(deserialize_bytes_tensor(raw).reshape(2, 2), arr)
    # str outputs are sent as UTF-8
    assert v2.tensor_to_bytes(np.array(["é"])) == b"\x02\x00\x00\x00\xc3\xa9"


def test_bytes_json_becomes_bytes_flat_or_nested():
    flat = v2.tensor_from_json("BYTES", [2, 1], ["a", "é"])
    nested = v2.tensor_from_json("BYTES", [2, 1], [["a"], ["é"]])
    assert flat.tolist() == nested.tolist() == [[b"a"], ["é".encode()]]
    assert v2.tensor_to_json(flat) == ["a", "é"]


def test_nested_json_must_match_shape():
    assert v2.tensor_from_json("INT32", [2, 2], [[1, 2], [3, 4]]).shape == (2, 2)
    with pytest.raises(BadRequest, match="nested as \\[2, 2\\] but 'shape' is \\[4, 1\\]"):
        v2.tensor_from_json("INT32", [4, 1], [[1, 2], [3, 4]])
    with pytest.raises(BadRequest, match="needs 6 elements, but 'data' holds 4"):
        v2.tensor_from_json("INT32", [2, 3], [1, 2, 3, 4])
    with pytest.raises(BadRequest, match="not nested as 'shape'"):
        v2.tensor_from_json("BYTES", [2, 2], [["a", "b"], ["c"]])


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT32", [1.5, 2], "must be integers"),
        ("UINT8", [256], "out of the UINT8 range"),
        ("INT8", [-129], "out of the INT8 range"),
        ("UINT64", [-1], "out of the UINT64 range"),
        ("FP16", [1e6], "would become infinite"),
        ("FP32", ["1.0"], "must be numbers"),
        ("BOOL", [0, 1], "must be true/false"),
        ("BYTES", [1, 2], "must be strings"),
        ("FP64", [1, None], "mixed or out-of-range"),
        ("FP64", [[1, 2], [3]], "ragged"),
        ("BF16", [1.0], "unsupported datatype 'BF16'"),
    ],
)
def test_json_values_are_checked_not_coerced(datatype, data, message):
    with pytest.raises(BadRequest, match=message):
        v2.tensor_from_json(datatype, [len(data)], data)


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "message"),
    [
        ("FP32", [3], b"\x00" * 8, "needs 12 bytes, found 8"),
        ("BOOL", [2], b"\x00\x02", "must be bytes 0 or 1"),
        ("BYTES", [2], b"\x01\x00\x00\x00a", "ends after 1 of 2 elements"),
        ("BYTES", [1], b"\x09\x00\x00\x00a", "claims 9 bytes"),
        ("BYTES", [1], b"\x01\x00\x00\x00ab", "1 bytes left over"),
    ],
)
def test_binary_sizes_are_checked(datatype, shape, raw, message):
    with pytest.raises(BadRequest, match=message):
        v2.tensor_from_bytes(datatype, shape, raw)


def request_body(doc: dict, *blobs: bytes) -> tuple[bytes, str | None]:
    head = json.dumps(doc).encode()
    return head + b"".join(blobs), str(len(head)) if blobs else None


def test_decode_request_mixes_json_and_binary_inputs():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"x", b"yz"], dtype=object)
    sraw = v2.tensor_to_bytes(s)
    body, header = request_body(
        {
            "id": "r1",
            "parameters": {"binary_data_output": True, "custom": 3},
            "inputs": [
                {"name": "a", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}},
                {"name": "j", "shape": [2], "datatype": "INT64", "data": [7, 8]},
                {"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(sraw)}},
            ],
            "outputs": [{"name": "o", "parameters": {"binary_data": False}}, {"name": "p"}],
        },
        a.tobytes(),
        sraw,
    )
    req = v2.decode_infer_request(body, header)
    np.testing.assert_array_equal(req.inputs["a"], a)
    assert req.inputs["j"].dtype == np.int64 and req.inputs["s"].tolist() == [b"x", b"yz"]
    assert req.id == "r1" and req.parameters["custom"] == 3 and req.binary_output
    assert [(o.name, o.binary) for o in req.outputs] == [("o", False), ("p", None)]


def test_single_tensor_form_is_a_one_input_request():
    body, _ = request_body({"name": "x", "shape": [2], "datatype": "FP64", "parameters": {"k": "v"}, "data": [1, 2]})
    req = v2.decode_infer_request(body)
    assert list(req.inputs) == ["x"] and req.inputs["x"].tolist() == [1.0, 2.0]
    assert req.parameters == {"k": "v"}


@pytest.mark.parametrize(
    ("doc", "blob", "header", "message"),
    [
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]},
            b"\x00" * 8,
            None,
            "needs 4 bytes, found 8",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]},
            b"\x00" * 8,
            None,
            "add up to 4",
        ),
        (
            {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]},
            b"\x00" * 4,
            None,
            "reaches past",
        ),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}]}, b"", "999", "body has"),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}]}, b"", "x", "must be an integer"),
        ({"inputs": []}, b"", None, "non-empty list"),
        ({"instances": [1]}, b"", None, "no 'inputs'"),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32"}]}, b"", None, "neither 'data'"),
        ({"inputs": [{"name": "a", "shape": [-1], "datatype": "FP32", "data": [1]}]}, b"", None, "non-negative"),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}] * 2}, b"", None, "given twice"),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}], "id": 5}, b"", None, "'id'"),
        (
            {
                "inputs": [
                    {
                        "name": "a",
                        "shape": [1],
                        "datatype": "FP32",
                        "data": [1],
                        "parameters": {"shared_memory_region": "r"},
                    }
                ]
            },
            b"",
            None,
            "'shared_memory_byte_size' must be given",
        ),
        (
            {
                "inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "o", "parameters": {"classification": "2"}}],
            },
            b"",
            None,
            "'classification' must be a positive integer",
        ),
        (
            {
                "inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "o"}, {"name": "o"}],
            },
            b"",
            None,
            "requested twice",
        ),
    ],
)
def test_malformed_requests_are_refused(doc, blob, header, message):
    body, computed = request_body(doc, blob) if blob else request_body(doc)
    with pytest.raises(BadRequest, match=message):
        v2.decode_infer_request(body, header or computed)


def test_encode_response_puts_binary_after_the_json_header():
    outputs = {
        "f": np.array([[0.1, 2.5]], dtype=np.float32),
        "s": np.array(["a", "bc"], dtype=object),
        "h": np.array([1.5], dtype=np.float16),
    }
    body, header = v2.encode_infer_response(
        outputs, model_name="m", model_version="3", request_id="r", binary={"s": True, "h": True}
    )
    doc = json.loads(body[:header])
    assert doc["model_name"] == "m" and doc["model_version"] == "3" and doc["id"] == "r"
    f, s, h = doc["outputs"]
    assert f == {"name": "f", "datatype": "FP32", "shape": [1, 2], "data": [0.1, 2.5]}
    assert s["parameters"] == {"binary_data_size": 11} and "data" not in s
    assert body[header:] == serialize_byte_tensor(outputs["s"]).item() + outputs["h"].tobytes()


def test_encode_response_all_json_has_no_header_length():
    body, header = v2.encode_infer_response({"o": np.array([1, 2])}, model_name="m")
    assert header is None and json.loads(body)["outputs"][0]["datatype"] == "INT64"


def test_non_utf8_bytes_need_binary_output():
    with pytest.raises(BadRequest, match="binary_data"):
        v2.encode_infer_response({"o": np.array([b"\xff"], dtype=object)}, model_name="m")


def test_outputs_of_python_objects_are_a_model_failure():
    mixed = np.empty(2, dtype=object)
    mixed[:] = [1.5, 2]
    assert v2.as_v2_array(mixed, "o").dtype == np.float64
    mixed[:] = [{"a": 1}, 2]
    with pytest.raises(ModelFailure, match="dict"):
        v2.as_v2_array(mixed, "o")
