"""The shared inference path: joining a streaming model's items where a protocol cannot stream."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from servekit.dataplane.data_plane import filter_outputs, join_stream
from servekit.errors import BadRequest, ModelFailure

STREAMING = textwrap.dedent("""
    import numpy as np
    import servekit

    @servekit.hookimpl
    def load(path):
        return "stream"

    @servekit.hookimpl
    def predict(inputs):
        rows = inputs["x"] if isinstance(inputs, dict) else inputs
        for row in rows:
            if row.min() < 0:
                raise ValueError("negative values")
            yield {"total": np.array([row.sum()])}
""")


def test_join_stream_concatenates_items_along_the_first_axis():
    joined = join_stream([{"a": np.array([1]), "b": np.array([[1, 2]])}, {"a": np.array([2]), "b": np.array([[3, 4]])}])
    assert joined["a"].tolist() == [1, 2] and joined["b"].tolist() == [[1, 2], [3, 4]]
    assert join_stream([{"s": np.float64(1.5)}, {"s": np.float64(2.5)}])["s"].tolist() == [1.5, 2.5]
    with pytest.raises(ModelFailure, match="outputs"):
        join_stream([{"a": np.array([1])}, {"b": np.array([1])}])
    with pytest.raises(ModelFailure, match="no items"):
        join_stream([])


def test_filter_outputs_keeps_the_order_asked_and_rejects_unknown_names():
    outputs = {"a": 1, "b": 2}
    assert list(filter_outputs(outputs, ["b", "a"])) == ["b", "a"]
    with pytest.raises(BadRequest, match="unknown output"):
        filter_outputs(outputs, ["c"])


def test_a_streaming_model_answers_plain_requests_on_v1_and_v2(tmp_path, servekit_app):
    (tmp_path / "stream").mkdir()
    (tmp_path / "stream" / "model.py").write_text(STREAMING)
    client = servekit_app(tmp_path)
    v1 = client.post("/v1/models/stream:predict", json={"instances": [[1, 2], [3, 4]]})
    assert v1.get_json() == {"predictions": [3, 7]}
    v2 = client.post(
        "/v2/models/stream/infer",
        json={"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}]},
    )
    assert v2.status_code == 200, v2.get_json()
    (out,) = v2.get_json()["outputs"]
    assert (out["name"], out["data"], out["shape"]) == ("total", [3, 7], [2])


def test_a_stream_that_fails_midway_is_a_model_failure(tmp_path, servekit_app):
    (tmp_path / "stream").mkdir()
    (tmp_path / "stream" / "model.py").write_text(STREAMING)
    client = servekit_app(tmp_path)
    r = client.post(
        "/v2/models/stream/infer",
        json={"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, -3, 4]}]},
    )
    assert r.status_code == 500
    assert "failed in predict: ValueError: negative values" in r.get_json()["error"]
