"""A model's hooks go to the plugin that loaded it, the folder's model.py and the wrappers; no one else.

Framework plugins here carry no "is this mine?" guard: a predict that is
handed another plugin's model would answer with the wrong numbers, so each
test fails if hooks are broadcast again.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from servekit.dataplane.repository import ModelRepository, discover
from servekit.hooks import manager as plugins
from sklearn_models import fit_iris

ROWS = {"instances": [[5.1, 3.5, 1.4, 0.2]]}

# Two framework plugins for two made-up artifacts, written as a third party would
# now write them: load decides, the other hooks trust that the model is theirs.
SCALE_PLUGIN = """
import json
import servekit

EVENTS = []


@servekit.hookimpl
def load(path):
    artifact = path / "model.scale.json"
    return json.loads(artifact.read_text()) if artifact.is_file() else None


@servekit.hookimpl
def predict(inputs, model):
    return [[v * model["scale"] for v in row] for row in inputs]


@servekit.hookimpl
def metadata(model):
    return servekit.ModelMetadata(platform="scale")


@servekit.hookimpl
def unload(model):
    EVENTS.append(("scale", model["scale"]))
    return True
"""

SHIFT_PLUGIN = """
import json
import servekit

EVENTS = []


@servekit.hookimpl
def load(path):
    artifact = path / "model.shift.json"
    return json.loads(artifact.read_text()) if artifact.is_file() else None


@servekit.hookimpl
def predict(inputs, model):
    return [[v + model["shift"] for v in row] for row in inputs]


@servekit.hookimpl
def explain(inputs, model):
    return [[model["shift"]] * len(row) for row in inputs]


@servekit.hookimpl
def metadata(model):
    return servekit.ModelMetadata(platform="shift")


@servekit.hookimpl
def unload(model):
    EVENTS.append(("shift", model["shift"]))
    return True
"""

# A cross-cutting file: a wrapper around every model's predict, and a plain
# predict from a plugin that loads nothing (it must never answer).
CROSS_CUTTING = """
import servekit

SEEN = []


@servekit.hookimpl(wrapper=True)
def predict(name):
    outputs = yield
    SEEN.append(name)
    return outputs
"""

STRAY_PREDICT = """
import servekit


@servekit.hookimpl
def predict(inputs):
    return ["stray"] * len(inputs)
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _artifact(models: Path, name: str, kind: str, value: float) -> None:
    _write(models / name / "1", f"model.{kind}.json", json.dumps({kind: value}))


def _framework_plugins(tmp_path: Path) -> list[str]:
    return [
        str(_write(tmp_path / "plugins", "scale.py", SCALE_PLUGIN)),
        str(_write(tmp_path / "plugins", "shift.py", SHIFT_PLUGIN)),
    ]


def test_each_model_is_answered_by_the_plugin_that_loaded_it(tmp_path, servekit_app):
    _artifact(tmp_path / "models", "tripled", "scale", 3)
    _artifact(tmp_path / "models", "plus_ten", "shift", 10)
    client = servekit_app(tmp_path / "models", plugin=_framework_plugins(tmp_path))
    assert client.post("/v1/models/tripled:predict", json={"instances": [[1, 2]]}).get_json() == {
        "predictions": [[3, 6]]
    }
    assert client.post("/v1/models/plus_ten:predict", json={"instances": [[1, 2]]}).get_json() == {
        "predictions": [[11, 12]]
    }
    assert client.get("/v2/models/tripled").get_json()["platform"] == "scale"
    assert client.get("/v2/models/plus_ten").get_json()["platform"] == "shift"


def test_a_hook_only_another_plugin_implements_answers_501(tmp_path, servekit_app):
    # shift implements explain; the scale model must not be handed to it
    _artifact(tmp_path / "models", "tripled", "scale", 3)
    _artifact(tmp_path / "models", "plus_ten", "shift", 10)
    client = servekit_app(tmp_path / "models", plugin=_framework_plugins(tmp_path))
    r = client.post("/v1/models/tripled:explain", json={"instances": [[1, 2]]})
    assert r.status_code == 501 and "explain" in r.get_json()["error"]
    r = client.post("/v1/models/plus_ten:explain", json={"instances": [[1, 2]]})
    assert r.get_json() == {"explanations": [[10, 10]]}


def test_unload_goes_to_the_loading_plugin_only(tmp_path):
    models = tmp_path / "models"
    _artifact(models, "tripled", "scale", 3)
    _artifact(models, "plus_ten", "shift", 10)
    specs = _framework_plugins(tmp_path)
    repo = ModelRepository(discover([models]), plugins.build_manager(specs), poll_interval=0)
    repo.load_now()
    scale, shift = (plugins.import_file(Path(s)) for s in specs)
    scale.EVENTS.clear()
    shift.EVENTS.clear()
    repo.unload_model("tripled")
    # shift.py registered last is asked first; under a broadcast it would take the scale model
    assert (scale.EVENTS, shift.EVENTS) == ([("scale", 3)], [])


def test_a_plain_hook_of_a_plugin_that_loaded_nothing_is_not_called(tmp_path, servekit_app):
    fit_iris(tmp_path / "models" / "iris", 1)
    stray = _write(tmp_path / "plugins", "stray.py", STRAY_PREDICT)
    client = servekit_app(tmp_path / "models", plugin=[str(stray)])
    assert client.post("/v1/models/iris:predict", json=ROWS).get_json() == {"predictions": ["setosa"]}


def test_wrappers_still_wrap_every_model(tmp_path, servekit_app):
    models = tmp_path / "models"
    fit_iris(models / "iris", 1)
    _artifact(models, "tripled", "scale", 3)
    _write(
        models / "doubler",
        "model.py",
        """
        import servekit

        @servekit.hookimpl
        def load():
            return 2

        @servekit.hookimpl
        def predict(inputs, model):
            return [[v * model for v in row] for row in inputs]
    """,
    )
    wrapper = _write(tmp_path / "plugins", "seen.py", CROSS_CUTTING)
    client = servekit_app(models, plugin=[*_framework_plugins(tmp_path), str(wrapper)])
    for name, rows in (("iris", ROWS["instances"]), ("tripled", [[1]]), ("doubler", [[1]])):
        assert client.post(f"/v1/models/{name}:predict", json={"instances": rows}).status_code == 200
    assert plugins.import_file(wrapper).SEEN == ["iris", "tripled", "doubler"]


def test_model_py_extends_the_plugin_that_loaded_its_model(tmp_path, servekit_app):
    models = tmp_path / "models"
    _artifact(models, "plus_ten", "shift", 10)
    # model.py adds a hook the shift plugin lacks (classify) and overrides one it has (explain)
    _write(
        models / "plus_ten",
        "model.py",
        """
        import servekit

        @servekit.hookimpl
        def classify(examples, model):
            return [[("shifted", float(model["shift"]))] for _ in examples]

        @servekit.hookimpl
        def explain(inputs, model):
            return ["from model.py"] * len(inputs)
    """,
    )
    client = servekit_app(models, plugin=_framework_plugins(tmp_path))
    assert client.post("/v1/models/plus_ten:predict", json={"instances": [[1]]}).get_json() == {"predictions": [[11]]}
    r = client.post("/v1/models/plus_ten:classify", json={"examples": [{"x": 1}]})
    assert r.get_json() == {"results": [[["shifted", 10.0]]]}
    assert client.post("/v1/models/plus_ten:explain", json={"instances": [[1]]}).get_json() == {
        "explanations": ["from model.py"]
    }


READS_SKLEARN = """
    import servekit
    from servekit_sklearn.estimator import load_estimator

    @servekit.hookimpl
    def load(path, config):
        # the estimator lives in a sub-folder the sklearn plugin does not look in
        return load_estimator(path / "weights", config.options)
"""


def _model_py_loaded_iris(models: Path) -> Path:
    fit_iris(models / "custom", 1)
    version = models / "custom" / "1"
    (version / "weights").mkdir()
    (version / "model.joblib").rename(version / "weights" / "model.joblib")
    _write(models / "custom", "model.py", READS_SKLEARN)
    return models / "custom"


def test_a_model_py_that_loads_answers_alone(tmp_path, servekit_app):
    # a scikit-learn model, but model.py loaded it: the sklearn plugin is not asked to predict
    _model_py_loaded_iris(tmp_path / "models")
    client = servekit_app(tmp_path / "models")
    r = client.post("/v1/models/custom:predict", json=ROWS)
    assert r.status_code == 501 and "predict" in r.get_json()["error"]


def test_a_model_py_load_with_plugin_named_in_servekit_yaml_gets_that_plugin(tmp_path, servekit_app):
    folder = _model_py_loaded_iris(tmp_path / "models")
    (folder / "servekit.yaml").write_text("plugin: sklearn\n")
    client = servekit_app(tmp_path / "models")
    assert client.post("/v1/models/custom:predict", json=ROWS).get_json() == {"predictions": ["setosa"]}
    assert (
        client.post(
            "/v1/models/custom:classify",
            json={
                "examples": [
                    {
                        "sepal_length": 5.1,
                        "sepal_width": 3.5,
                        "petal_length": 1.4,
                        "petal_width": 0.2,
                    }
                ]
            },
        ).status_code
        == 200
    )


def test_the_repository_remembers_which_plugin_loaded_each_version(tmp_path):
    models = tmp_path / "models"
    fit_iris(models / "iris", 1)
    _artifact(models, "tripled", "scale", 3)
    _write(
        models / "counter",
        "model.py",
        """
        import servekit

        class Counter:
            @servekit.hookimpl
            def load(self):
                return {"n": 0}
    """,
    )
    repo = ModelRepository(discover([models]), plugins.build_manager(_framework_plugins(tmp_path)), poll_interval=0)
    repo.load_now()
    loaded_by = {name: repo.resolve(name).loaded_by for name in ("iris", "tripled", "counter")}
    assert loaded_by == {"iris": "sklearn", "tripled": "scale", "counter": "model.py:counter.Counter"}


def test_a_wrapper_around_load_runs_once_and_sees_the_model(tmp_path):
    models = tmp_path / "models"
    _artifact(models, "tripled", "scale", 3)
    watcher = _write(
        tmp_path / "plugins",
        "watch_load.py",
        """
        import servekit

        LOADED = []

        @servekit.hookimpl(wrapper=True)
        def load(name):
            model = yield
            LOADED.append((name, model))
            return model
    """,
    )
    pm = plugins.build_manager([*_framework_plugins(tmp_path), str(watcher)])
    repo = ModelRepository(discover([models]), pm, poll_interval=0)
    repo.load_now()
    assert plugins.import_file(watcher).LOADED == [("tripled", {"scale": 3})]
    assert repo.resolve("tripled").loaded_by == "scale"


def test_load_keeps_pluggys_order(tmp_path):
    # both claim the folder: the later registered answers, unless the other is tryfirst
    models = tmp_path / "models"
    _artifact(models, "tripled", "scale", 3)
    first = _write(tmp_path / "plugins", "first.py", SCALE_PLUGIN)
    later = _write(tmp_path / "plugins", "later.py", SCALE_PLUGIN)
    repo = ModelRepository(discover([models]), plugins.build_manager([str(first), str(later)]), poll_interval=0)
    repo.load_now()
    assert repo.resolve("tripled").loaded_by == "later"
    eager = _write(
        tmp_path / "plugins",
        "eager.py",
        SCALE_PLUGIN.replace("@servekit.hookimpl\ndef load", "@servekit.hookimpl(tryfirst=True)\ndef load"),
    )
    repo = ModelRepository(discover([models]), plugins.build_manager([str(eager), str(later)]), poll_interval=0)
    repo.load_now()
    assert repo.resolve("tripled").loaded_by == "eager"
