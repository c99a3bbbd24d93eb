"""The TensorFlow plugin's hooks called directly: folder detection, devices, outputs, unloading,
and the promise that a server without SavedModels never imports TensorFlow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import servekit_tensorflow as plugin
from repo_paths import TF_DATA
from servekit.dataplane.repository import ModelRepository, discover
from servekit.errors import BadRequest
from servekit.hooks import manager as plugins
from servekit.types import ModelConfig
from sklearn_models import fit_regressor

# every test here loads TensorFlow: out of the quick lane
pytestmark = pytest.mark.slow

THREE = TF_DATA / "saved_model_half_plus_three" / "00000123"
TWO = TF_DATA / "saved_model_half_plus_two_2_versions" / "00000123"


def test_sklearn_only_server_imports_no_tensorflow(tmp_path):
    """A server over a sklearn model, with this plugin installed, never imports TensorFlow or torch."""
    fit_regressor(tmp_path / "linear")
    script = textwrap.dedent(
        f"""
        import json, sys
        from servekit.server.app import create_app
        from servekit.server.settings import Settings

        app = create_app(Settings(paths=[{str(tmp_path / "linear")!r}], poll_interval=0), start=False)
        app.extensions["servekit"].repository.load_now()
        plugins = [name for name, _ in app.extensions["servekit"].repository.pm.list_name_plugin()]
        r = app.test_client().post("/v1/models/linear:predict", data=json.dumps({{"instances": [[1, 1]]}}))
        print(json.dumps({{"status": r.status_code, "body": r.get_json(), "plugins": plugins,
                          "tensorflow": "tensorflow" in sys.modules, "torch": "torch" in sys.modules}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == 200 and result["body"]["predictions"] == [pytest.approx(6.0)]
    assert "tensorflow" in result["plugins"]  # installed and registered...
    assert result["tensorflow"] is False  # ...but TensorFlow itself never imported
    assert result["torch"] is False


@pytest.fixture(scope="module")
def three():
    model = plugin.load(path=THREE, config=ModelConfig())
    yield model
    plugin.unload(model=model)


def test_load_returns_none_for_other_folders(tmp_path):
    assert plugin.load(path=tmp_path, config=ModelConfig()) is None
    fit_regressor(tmp_path / "sk")
    assert plugin.load(path=tmp_path / "sk" / "1", config=ModelConfig()) is None
    # a graph file without variables/ is not claimed unless the model says plugin: tensorflow
    (tmp_path / "pb").mkdir()
    shutil.copy(THREE / "saved_model.pb", tmp_path / "pb" / "saved_model.pb")
    assert plugin.load(path=tmp_path / "pb", config=ModelConfig()) is None
    assert plugin.load(path=THREE, config=ModelConfig(plugin="sklearn")) is None


def test_only_the_models_it_loaded_reach_its_hooks(tmp_path):
    # the hooks carry no "is this mine?" guard: the repository routes each model to its loader
    fit_regressor(tmp_path / "linear")
    repo = ModelRepository(discover([THREE.parent, tmp_path / "linear"]), plugins.build_manager(), poll_interval=0)
    repo.load_now()
    hooks = ("predict", "metadata", "classify", "regress", "unload")
    answering = {
        name: {i.plugin_name for hook in hooks for i in getattr(repo.resolve(name).hooks, hook).get_hookimpls()}
        for name in ("saved_model_half_plus_three", "linear")
    }
    assert repo.resolve("saved_model_half_plus_three").loaded_by == "tensorflow"
    assert answering["saved_model_half_plus_three"] == {"tensorflow"}
    assert "tensorflow" not in answering["linear"]


def test_unknown_tags_fail_the_load_clearly():
    with pytest.raises(RuntimeError, match="options.tags"):
        plugin.load(path=THREE, config=ModelConfig(options={"tags": ["gpu"]}))


def test_predict_returns_named_outputs_and_honours_output_names(three):
    out = plugin.predict(inputs=np.array([1.0, 2.0]), model=three, signature_name=None, output_names=None)
    assert list(out) == ["y"] and out["y"].tolist() == [3.5, 4.0]
    out = plugin.predict(inputs={"x": np.array([1.0])}, model=three, signature_name=None, output_names=["y"])
    assert list(out) == ["y"]
    with pytest.raises(BadRequest, match="no output"):
        plugin.predict(inputs=np.array([1.0]), model=three, signature_name=None, output_names=["z"])


def test_metadata_hook(three):
    meta = plugin.metadata(model=three)
    sig = meta.signature("serving_default")
    assert meta.platform == "tensorflow"
    # this TF 1.0 graph records no shapes in its SignatureDefs: unknown, not scalar
    assert [(t.name, t.datatype, t.shape, t.tensor_name) for t in sig.inputs] == [("x", "FP32", None, "x:0")]
    assert sig.method_name == "tensorflow/serving/predict" and sig.defaults == {}


def test_device_cpu_hides_gpus():
    import tensorflow as tf
    from servekit_tensorflow.savedmodel import _session_config

    config, pin = _session_config(tf, "cpu", {"intra_op_parallelism_threads": 1})
    assert config.device_count["GPU"] == 0 and pin is None
    assert config.intra_op_parallelism_threads == 1
    config, pin = _session_config(tf, "auto", {})
    assert "GPU" not in config.device_count and pin is None
    with pytest.raises(ValueError, match="non-negative integer"):
        _session_config(tf, "cpu", {"inter_op_parallelism_threads": "many"})


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_cuda_without_a_gpu_fails_the_load_with_the_reason(tmp_path, servekit_app):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    shutil.copytree(TWO, tmp_path / "m" / "1")
    (tmp_path / "m" / "servekit.yaml").write_text("device: cuda\n")
    status = servekit_app(tmp_path / "m").get("/v1/models/m").get_json()["model_version_status"][0]
    assert status["state"] == "END"
    assert "TensorFlow sees 0 GPU(s)" in status["status"]["error_message"]


def test_unload_closes_the_session():
    model = plugin.load(path=TWO, config=ModelConfig(device="cpu"))
    assert plugin.unload(model=model) is True
    with pytest.raises(RuntimeError):
        model.session.run("y:0", {"x:0": [[1.0]]})


def test_int64_feature_range_is_checked():
    from servekit_tensorflow.examples import serialize

    assert len(serialize([{"a": [1, 2]}, {"b": [b"x"]}, {"c": [0.5]}, {"d": []}])) == 4
    with pytest.raises(BadRequest, match="int64 range"):
        serialize([{"a": [2**64]}])


def test_pbtxt_saved_model(tmp_path):
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    folder = tmp_path / "1"
    shutil.copytree(THREE, folder)
    proto = saved_model_pb2.SavedModel.FromString((folder / "saved_model.pb").read_bytes())
    (folder / "saved_model.pb").unlink()
    (folder / "saved_model.pbtxt").write_text(text_format.MessageToString(proto))
    model = plugin.load(path=Path(folder), config=ModelConfig())
    try:
        out = plugin.predict(inputs=np.array([4.0]), model=model, signature_name=None, output_names=None)
        assert out["y"].tolist() == [5.0]
    finally:
        plugin.unload(model=model)


def test_an_input_with_a_default_may_be_left_out():
    """TF2 signatures may give inputs defaults (here x = [0.0]); TF Serving then lets them be omitted."""
    model = plugin.load(path=TF_DATA / "saved_model_half_plus_two_tf2_cpu" / "00000123", config=ModelConfig())
    try:
        out = plugin.predict(inputs={}, model=model, signature_name=None, output_names=None)
        assert out["y"].tolist() == [2.0]
        with pytest.raises(BadRequest, match="missing input"):
            plugin.predict(inputs={}, model=model, signature_name="regress_x2_to_y3", output_names=None)
    finally:
        plugin.unload(model=model)
