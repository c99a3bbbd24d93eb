"""Hooks around the model's life and the server's: load, metadata, unload, routes, start-up."""

from __future__ import annotations

import textwrap

LIFECYCLE = textwrap.dedent("""
    import json
    import servekit
    from servekit import ModelMetadata, Signature, TensorSpec

    EVENTS = []

    @servekit.hookimpl
    def load(path, config, name, version):
        EVENTS.append(("load", name, version))
        return {"w": json.loads((path / "weights.json").read_text())}

    @servekit.hookimpl
    def unload(model):
        EVENTS.append(("unload", model["w"]))
        return True

    @servekit.hookimpl
    def metadata(model, name, version):
        return ModelMetadata(signatures={"serving_default": Signature(
            inputs=[TensorSpec("x", "FP32", [-1, 2], tensor_name="x:0")],
            outputs=[TensorSpec("y", "FP32", [-1])])}, platform="custom")

    @servekit.hookimpl
    def predict(inputs, model):
        return {"y": inputs.sum(axis=1) * model["w"]}

    @servekit.hookimpl
    def classify(examples, model):
        return [[("big", 1.0)] if ex["x"][0] > 1 else [("small", 1.0)] for ex in examples]

    @servekit.hookimpl
    def regress(examples, model):
        return [ex["x"][0] * model["w"] for ex in examples]

    @servekit.hookimpl
    def explain(inputs, model):
        return {"attributions": inputs * model["w"]}
""")

ROUTES = textwrap.dedent("""
    from flask import jsonify
    import servekit

    STARTED = []

    @servekit.hookimpl
    def server_started(models):
        STARTED.extend(models)

    @servekit.hookimpl
    def register_routes(app):
        @app.get("/hello")
        def hello():
            return jsonify(models=app.extensions["servekit"].model_names(), started=STARTED)
""")


def _model(tmp_path, weight=2):
    folder = tmp_path / "models" / "lin"
    (folder / "1").mkdir(parents=True)
    (folder / "model.py").write_text(LIFECYCLE)
    (folder / "1" / "weights.json").write_text(str(weight))
    return folder


def test_load_metadata_predict_classify_regress_explain(tmp_path, servekit_app):
    _model(tmp_path)
    client = servekit_app(tmp_path / "models")
    meta = client.get("/v1/models/lin/metadata").get_json()
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["x"] == {
        "dtype": "DT_FLOAT",
        "name": "x:0",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "2", "name": ""}], "unknown_rank": False},
    }
    assert client.post("/v1/models/lin:predict", json={"instances": [[1, 2]]}).get_json() == {"predictions": [6]}
    r = client.post("/v1/models/lin:classify", json={"examples": [{"x": 2}, {"x": 0.5}]})
    assert r.get_json() == {"results": [[["big", 1.0]], [["small", 1.0]]]}
    assert client.post("/v1/models/lin:regress", json={"examples": [{"x": 1.5}]}).get_json() == {"results": [3.0]}
    assert client.post("/v1/models/lin:explain", json={"instances": [[1, 2]]}).get_json() == {"explanations": [[2, 4]]}


def test_unload_is_called_when_a_version_is_replaced(tmp_path, servekit_app):
    folder = _model(tmp_path)
    client = servekit_app(tmp_path / "models")
    repo = client.application.extensions["servekit"].repository

    def events():  # each version runs model.py afresh: its own module, its own EVENTS
        return repo.resolve("lin").hooks.load.get_hookimpls()[-1].plugin.EVENTS

    first = events()
    (folder / "2").mkdir()
    (folder / "2" / "weights.json").write_text("3")
    repo.sync()
    assert client.post("/v1/models/lin:predict", json={"instances": [[1, 1]]}).get_json() == {"predictions": [6]}
    assert first == [("load", "lin", 1), ("unload", 2)]
    assert events() == [("load", "lin", 2)]


def test_register_routes_and_server_started(tmp_path, servekit_app):
    _model(tmp_path)
    plugin = tmp_path / "routes.py"
    plugin.write_text(ROUTES)
    client = servekit_app(tmp_path / "models", plugin=[str(plugin)])
    assert client.get("/hello").get_json() == {"models": ["lin"], "started": ["lin"]}
