"""A shape the model's metadata rules out is the same 400 over V1 (TF Serving REST) as over V2."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.slow  # a model loaded per test

DECLARED = textwrap.dedent("""
    import servekit
    from servekit import ModelMetadata, Signature, TensorSpec

    @servekit.hookimpl
    def load(path):
        return "sum"

    @servekit.hookimpl
    def metadata(model):
        return ModelMetadata(signatures={"serving_default": Signature(
            inputs=[TensorSpec("x", "FP32", [-1, 2])], outputs=[TensorSpec("y", "FP32", [-1])])})

    @servekit.hookimpl
    def predict(inputs):
        x = inputs["x"] if isinstance(inputs, dict) else inputs  # V1 rows of one input: one array
        return {"y": x.sum(axis=1)}
""")

MESSAGE = "input 'x': shape [1, 3] does not match the model's shape [-1, 2] (-1 means any size)"


@pytest.fixture
def client(tmp_path, servekit_app):
    folder = tmp_path / "models" / "pairs" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(DECLARED)
    return servekit_app(tmp_path / "models")


def test_v2_refuses_the_shape(client):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    r = client.post("/v2/models/pairs/infer", json=body)
    assert (r.status_code, r.get_json()) == (400, {"error": MESSAGE})


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [[1, 2, 3]]},  # rows of the one input
        {"instances": [{"x": [1, 2, 3]}]},  # rows by name
        {"inputs": {"x": [[1, 2, 3]]}},  # columns
        {"inputs": [[1, 2, 3]]},  # columns of the one input
    ],
)
def test_v1_refuses_the_same_shape(client, body):
    for verb in ("predict", "explain"):
        r = client.post(f"/v1/models/pairs:{verb}", json=body)
        assert (r.status_code, r.get_json()) == (400, {"error": MESSAGE})


def test_v1_serves_a_shape_that_fits(client):
    r = client.post("/v1/models/pairs:predict", json={"instances": [[1, 2], [3, 4]]})
    assert (r.status_code, r.get_json()) == (200, {"predictions": [3.0, 7.0]})
