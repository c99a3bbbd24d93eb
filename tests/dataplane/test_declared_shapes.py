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


# -- values: what a declared input of numbers takes -----------------------------------------------

VALUES = textwrap.dedent("""
    import servekit
    from servekit import ModelMetadata, Signature, TensorSpec

    @servekit.hookimpl
    def load(path):
        return path.parent.name

    @servekit.hookimpl
    def metadata(model):
        x = TensorSpec("x", "FP32", [-1, 2], allow_nan=model == "missing")
        return ModelMetadata(signatures={"serving_default": Signature(inputs=[x], outputs=[TensorSpec("y", "FP32", [-1])])})

    @servekit.hookimpl
    def predict(inputs):
        x = inputs["x"] if isinstance(inputs, dict) else inputs
        return {"y": x.astype("float32").sum(axis=1)}
""")


@pytest.fixture
def values_client(tmp_path, servekit_app):
    for name in ("strict", "missing"):  # the same model; "missing" declares allow_nan
        folder = tmp_path / "models" / name / "1"
        folder.mkdir(parents=True)
        (folder.parent / "model.py").write_text(VALUES)
    return servekit_app(tmp_path / "models")


def v2(row: str) -> str:
    return f'{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": {row}}}]}}'


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("[1, NaN]", "input 'x' contains NaN at row 0 column 1; this model does not take missing values"),
        ("[Infinity, 1]", "input 'x' contains infinity at row 0 column 0; this model takes only finite numbers"),
        ("[1, -Infinity]", "input 'x' contains infinity at row 0 column 1"),
        ("[true, 1]", "a tensor mixes boolean and number values"),
    ],
)
def test_v1_and_v2_refuse_what_the_declared_input_does_not_take(values_client, row, message):
    """A hand-written model.py that declares FP32 gets no NaN, infinity or boolean: a 400, not its own 500."""
    for path, body in [
        ("/v1/models/strict:predict", f'{{"instances": [{row}]}}'),
        ("/v1/models/strict:predict", f'{{"inputs": {{"x": [{row}]}}}}'),
        ("/v2/models/strict/infer", v2(row)),
    ]:
        r = values_client.post(path, data=body, content_type="application/json")
        assert r.status_code == 400, (path, body, r.get_data(as_text=True))
        error = r.get_json()["error"]
        assert message in error or (row.startswith("[true") and "boolean" in error), (path, error)


def test_booleans_and_strings_are_not_numbers(values_client):
    body = '{"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1, 2], "data": [true, false]}]}'
    r = values_client.post("/v2/models/strict/infer", data=body, content_type="application/json")
    assert (r.status_code, r.get_json()) == (400, {"error": "input 'x': expected numbers (FP32), found booleans"})
    r = values_client.post("/v1/models/strict:predict", json={"instances": [["a", "b"]]})
    assert (r.status_code, r.get_json()) == (
        400,
        {"error": "input 'x': expected numbers, found the string 'a' at row 0 column 0"},
    )


def test_an_input_declared_with_allow_nan_takes_nan_but_not_infinity(values_client):
    r = values_client.post(
        "/v1/models/missing:predict", data='{"instances": [[1, NaN]]}', content_type="application/json"
    )
    assert r.status_code == 200 and r.get_data(as_text=True) == '{"predictions":[NaN]}'
    r = values_client.post("/v2/models/missing/infer", data=v2("[Infinity, 1]"), content_type="application/json")
    assert r.status_code == 400
    assert r.get_json()["error"].endswith("takes only finite numbers; send NaN for a missing value")
