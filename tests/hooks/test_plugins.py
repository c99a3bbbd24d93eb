"""The plugin manager: entry points, --plugin files, model.py overrides, clashes, broken plugins."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from servekit.hooks import manager as plugins
from sklearn_models import fit_iris

ROWS = {"instances": [[5.1, 3.5, 1.4, 0.2]]}


def test_builtin_sklearn_plugin_is_registered_through_the_entry_point_group():
    pm = plugins.build_manager()
    info = {i.name: i for i in plugins.describe(pm)}
    assert "sklearn" in info
    assert {"load", "predict", "classify", "regress", "explain", "metadata"} <= set(info["sklearn"].hooks)
    assert info["sklearn"].source.startswith("servekit")


@pytest.mark.slow
def test_servekit_plugins_command_lists_the_sklearn_plugin_and_its_hooks():
    out = subprocess.run(
        [sys.executable, "-m", "servekit", "plugins"], capture_output=True, text=True, check=True
    ).stdout
    assert "sklearn" in out and "predict" in out and "classify" in out
    listed = json.loads(
        subprocess.run(
            [sys.executable, "-m", "servekit", "plugins", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert any(p["name"] == "sklearn" and "load" in p["hooks"] for p in listed)


def test_model_py_overrides_the_framework_plugin_for_its_model_only(tmp_path, servekit_app):
    fit_iris(tmp_path / "custom", 1)
    fit_iris(tmp_path / "plain", 1)
    (tmp_path / "custom" / "model.py").write_text(
        textwrap.dedent("""
        import servekit

        @servekit.hookimpl
        def predict(inputs, model):
            # the sklearn plugin loaded `model`; this hook replaces its predict
            return {"label": model.estimator.predict(inputs), "custom": [1] * len(inputs)}
    """)
    )
    client = servekit_app(tmp_path)
    custom = client.post("/v1/models/custom:predict", json=ROWS).get_json()
    assert custom == {"predictions": [{"label": "setosa", "custom": 1}]}
    plain = client.post("/v1/models/plain:predict", json=ROWS).get_json()
    assert plain == {"predictions": ["setosa"]}


def test_hooks_as_methods_of_a_class(tmp_path, servekit_app):
    folder = tmp_path / "counter"
    folder.mkdir()
    (folder / "model.py").write_text(
        textwrap.dedent("""
        import servekit

        class Counter:
            def __init__(self):
                self.calls = 0

            @servekit.hookimpl
            def load(self, path, config):
                return {"step": config.options.get("step", 1)}

            @servekit.hookimpl
            def predict(self, inputs, model):
                self.calls += model["step"]
                return [self.calls] * len(inputs)
    """)
    )
    (folder / "servekit.yaml").write_text("options: {step: 5}\n")
    client = servekit_app(tmp_path)
    assert client.post("/v1/models/counter:predict", json={"instances": [1]}).get_json() == {"predictions": [5]}
    assert client.post("/v1/models/counter:predict", json={"instances": [1]}).get_json() == {"predictions": [10]}


def test_plugin_file_given_on_the_command_line_wraps_every_model(tmp_path, servekit_app):
    fit_iris(tmp_path / "models" / "iris", 1)
    plugin = tmp_path / "upper.py"
    plugin.write_text(
        textwrap.dedent("""
        import servekit

        @servekit.hookimpl(wrapper=True)
        def predict(inputs):
            outputs = yield
            return {name: [str(v).upper() for v in values] for name, values in outputs.items()}
    """)
    )
    client = servekit_app(tmp_path / "models", plugin=[str(plugin)])
    assert client.post("/v1/models/iris:predict", json=ROWS).get_json() == {"predictions": ["SETOSA"]}


def test_a_model_without_a_hook_answers_501(tmp_path, servekit_app):
    fit_iris(tmp_path / "iris", 1)
    folder = tmp_path / "only_predict"
    folder.mkdir()
    (folder / "model.py").write_text("import servekit\n\n@servekit.hookimpl\ndef load(path):\n    return 'x'\n")
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/only_predict:predict", json={"instances": [1]})
    assert r.status_code == 501 and "predict" in r.get_json()["error"]


def test_two_plugins_with_one_name_fail_naming_both(tmp_path):
    one = tmp_path / "a" / "dup.py"
    two = tmp_path / "b" / "dup.py"
    for f in (one, two):
        f.parent.mkdir()
        f.write_text("")
    with pytest.raises(plugins.PluginError, match="dup.*registered twice.*a/dup.py.*b/dup.py"):
        plugins.build_manager([str(one), str(two)])


def test_a_broken_installed_plugin_is_warned_about_and_skipped(tmp_path, caplog, monkeypatch):
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[servekit]\nbroken = broken_plugin_module\n")
    (tmp_path / "broken_plugin_module.py").write_text("raise ImportError('missing dependency xyz')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level("WARNING"):
        pm = plugins.build_manager()
    assert "skipping plugin 'broken'" in caplog.text and "missing dependency xyz" in caplog.text
    assert pm.get_plugin("sklearn") is not None


def test_allow_list_limits_installed_plugins(monkeypatch):
    monkeypatch.setenv("SERVEKIT_LOAD_PLUGINS", "")
    assert plugins.describe(plugins.build_manager()) == []


def test_preprocess_and_postprocess_map_inputs_and_outputs(tmp_path, servekit_app):
    fit_iris(tmp_path / "iris", 1)
    (tmp_path / "iris" / "model.py").write_text(
        textwrap.dedent("""
        import numpy as np
        import servekit

        @servekit.hookimpl
        def preprocess(inputs):
            return np.asarray(inputs, dtype=float) / 10.0   # the client sends millimetres

        @servekit.hookimpl
        def postprocess(outputs):
            return {"species": np.char.upper(outputs["predict"].astype(str))}
    """)
    )
    client = servekit_app(tmp_path)
    r = client.post("/v1/models/iris:predict", json={"instances": [[51, 35, 14, 2]]})
    assert r.get_json() == {"predictions": ["SETOSA"]}
