"""The torch plugin's parts: dtype casts, device choice, safe archives, options, lazy import.

These run in-process (``servekit_app``) or call the plugin's modules directly;
``test_torch.py`` covers the real server.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")  # a Python without torch (scripts/test-pythons.sh) skips these
from servekit.errors import BadRequest, ModelFailure
from servekit.types import ModelConfig
from servekit_torch import tensors
from servekit_torch.loading import check_export_archive, load_model
from sklearn_models import fit_regressor
from torch_models import ALL_CLASSES, ONLY_CLASSIFIER, import_source

CPU = torch.device("cpu")
ROWS = [[0.5, -1.25, 2.0, 0.1], [1.0, 3.5, -0.75, 4.0]]


def call(client, method: str, url: str, **kwargs):
    """Status and JSON of one in-process request, its response closed (frees the worker slot)."""
    response = client.open(url, method=method, **kwargs)
    try:
        return response.status_code, response.get_json()
    finally:
        response.close()


# -- dtype casts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "array, target, expected",
    [
        (np.array([0.1, 2.5]), "float32", torch.tensor([0.1, 2.5], dtype=torch.float32)),
        (np.array([1, 2]), "float32", torch.tensor([1.0, 2.0])),
        (np.array([1.0, 7.0]), "int64", torch.tensor([1, 7])),
        (np.array([0, 1]), "bool", torch.tensor([False, True])),
        (np.array([255], np.int64), "uint8", torch.tensor([255], dtype=torch.uint8)),
        (np.array([1.5, -2.0]), "bfloat16", torch.tensor([1.5, -2.0], dtype=torch.bfloat16)),
        (np.array([np.nan, np.inf]), "float32", torch.tensor([np.nan, np.inf], dtype=torch.float32)),
        (np.array([3, 4], np.uint16), "int32", torch.tensor([3, 4], dtype=torch.int32)),
    ],
)
def test_lossless_casts_are_made(array, target, expected):
    tensor = tensors.to_tensor(array, "x", target, CPU)
    assert tensor.dtype is expected.dtype
    torch.testing.assert_close(tensor, expected, equal_nan=True)


@pytest.mark.parametrize(
    "array, target, words",
    [
        (np.array([1.5]), "int64", "would change"),
        (np.array([np.nan]), "int32", "would change"),
        (np.array([300]), "uint8", "out of the range of UINT8"),
        (np.array([-1]), "uint8", "out of the range of UINT8"),
        (np.array([2**63], np.uint64), "int64", "out of the range of INT64"),
        (np.array([2]), "bool", "would change"),
        (np.array([2**24 + 1]), "float32", "would change"),
        (np.array([257]), "bfloat16", "exactly as bfloat16"),
        (np.array(["a"], dtype=object), "float32", "found BYTES"),
    ],
)
def test_lossy_casts_are_refused(array, target, words):
    with pytest.raises(BadRequest, match=words.replace("(", r"\(")):
        tensors.to_tensor(array, "x", target, CPU)


def test_floats_beyond_a_narrower_range_round_to_infinity():
    # IEEE rounding, as TF Serving feeds JSON numbers to a DT_FLOAT input
    out = tensors.to_tensor(np.array([1e300, -1e300, 70000.0]), "x", "float32", CPU)
    assert out.tolist() == [float("inf"), float("-inf"), 70000.0]
    assert tensors.to_tensor(np.array([70000.0]), "x", "float16", CPU).tolist() == [float("inf")]


def test_default_dtypes_follow_the_model_float_type():
    assert tensors.default_dtype(np.zeros(1), "float32") == "float32"
    # a model without floating parameters declares nothing: the client's datatype stays
    assert tensors.default_dtype(np.zeros(1, np.float16), None) == "float16"
    assert tensors.default_dtype(np.zeros(1), None) == "float64"
    assert tensors.default_dtype(np.zeros(1, np.float16), "bfloat16") == "bfloat16"
    assert tensors.default_dtype(np.zeros(1, np.int32), "float32") == "int32"
    assert tensors.default_dtype(np.zeros(1, np.uint32), "float32") == "int64"
    assert tensors.default_dtype(np.zeros(1, bool), "float32") == "bool"


def test_outputs_come_back_in_wire_dtypes():
    assert tensors.to_numpy(torch.ones(2, dtype=torch.bfloat16), "y").dtype == np.float32
    assert tensors.to_numpy(torch.ones(2, dtype=torch.float16), "y").dtype == np.float16
    assert tensors.to_numpy(torch.ones(2, dtype=torch.float16), "y", widen_half=True).dtype == np.float32
    assert tensors.to_numpy(torch.ones(2, dtype=torch.uint8), "y").dtype == np.uint8
    assert tensors.to_numpy(3, "y").tolist() == 3
    with pytest.raises(ModelFailure, match="must return tensors"):
        tensors.to_numpy("text", "y")
    with pytest.raises(ModelFailure, match="no wire datatype"):
        tensors.to_numpy(torch.ones(2, dtype=torch.complex64), "y")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("FP32", "float32"),
        ("BF16", "bfloat16"),
        ("int64", "int64"),
        ("torch.float16", "float16"),
        ("double", "float64"),
    ],
)
def test_datatype_names(name, expected):
    assert tensors.dtype_name(name) == expected
    with pytest.raises(ValueError, match="unknown datatype"):
        tensors.dtype_name("FP8")


# -- device choice -------------------------------------------------------------------


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_picks_cuda_only_when_torch_sees_a_gpu(monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert tensors.resolve_device("auto") == torch.device("cpu")
    fake_gpus(monkeypatch, 2)
    assert tensors.resolve_device("auto") == torch.device("cuda", 0)
    assert tensors.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert tensors.resolve_device("cpu") == torch.device("cpu")


def test_missing_gpus_fail_the_load_clearly(monkeypatch):
    fake_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="device 'cuda' was requested but"):
        tensors.resolve_device("cuda")
    fake_gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match="only 1 GPU"):
        tensors.resolve_device("cuda:1")
    with pytest.raises(ValueError, match="cuda:N"):
        tensors.resolve_device("cuda:x")


@pytest.mark.slow  # seconds of its own: out of the quick lane
def test_cuda_requested_without_cuda_reports_on_status(servekit_app, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    folder = tmp_path / "gpu_only" / "1"
    folder.mkdir(parents=True)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 1)), folder / "model.pt")
    (tmp_path / "gpu_only" / "servekit.yaml").write_text("device: cuda:0\n")
    status, body = call(
        servekit_app(tmp_path / "gpu_only"), "POST", "/v1/models/gpu_only:predict", json={"instances": [[1.0, 2.0]]}
    )
    assert status == 503
    assert "device 'cuda:0' was requested but" in body["error"]


def test_half_precision_is_a_gpu_option(servekit_app, tmp_path, caplog):
    module = import_source(tmp_path / "clf", ONLY_CLASSIFIER).Classifier().eval()
    (tmp_path / "clf" / "1").mkdir()
    torch.save(module.state_dict(), tmp_path / "clf" / "1" / "model.pth")
    (tmp_path / "clf" / "servekit.yaml").write_text("device: cpu\noptions: {half: true}\n")
    with caplog.at_level(logging.WARNING, logger="servekit.torch"):
        client = servekit_app(tmp_path / "clf")
    assert "applies on a GPU only" in caplog.text
    status, body = call(client, "POST", "/v1/models/clf:predict", json={"instances": ROWS})
    assert status == 200
    expected = module(torch.tensor(ROWS)).detach().numpy()
    np.testing.assert_array_equal(np.asarray(body["predictions"], np.float32), expected)


# -- options and safe loading -------------------------------------------------------------


def state_dict_folder(tmp_path: Path, cls: str, yaml: str) -> Path:
    classes = import_source(tmp_path / "m", ALL_CLASSES)
    (tmp_path / "m" / "1").mkdir(exist_ok=True)
    torch.save(getattr(classes, cls)().state_dict(), tmp_path / "m" / "1" / "model.pth")
    (tmp_path / "m" / "servekit.yaml").write_text(yaml)
    return tmp_path / "m"


@pytest.mark.parametrize(
    "cls, options, words",
    [
        ("Pair", {"class": "Pair", "inputs": {"y": "FP32"}}, "options.inputs names 'y', but forward() takes x"),
        ("Pair", {"class": "Pair", "outputs": ["a", "b", "c"]}, "has 3 names, but forward() returns 2"),
        ("Pair", {"class": "Pair", "half": "yes"}, "options.half must be true or false"),
        ("Pair", {"class": "Nope"}, "no nn.Module class of that name"),
        ("Pair", {"class": "Pair", "init": {"width": 3}}, "Pair(**options.init) failed"),
        ("Classifier", {"class": "TwoHeads"}, "does not fit TwoHeads"),
        (
            "TwoHeads",
            {
                "class": "TwoHeads",
                "inputs": {"x": {"datatype": "FP32", "shape": [-1, 5]}, "offset": {"datatype": "FP32", "shape": [-1]}},
            },
            "failed on zeros of the shapes declared",
        ),
    ],
)
def test_bad_options_fail_the_load(tmp_path, cls, options, words):
    folder = state_dict_folder(tmp_path, cls, "")
    config = ModelConfig(device="cpu", options=options, base_path=folder)
    with pytest.raises(ValueError) as info:
        load_model(folder / "1" / "model.pth", config)
    assert words in str(info.value)


def test_state_dict_may_be_wrapped_like_a_lightning_checkpoint(tmp_path):
    folder = state_dict_folder(tmp_path, "Pair", "")
    state = torch.load(folder / "1" / "model.pth", weights_only=True)
    torch.save({"state_dict": state, "epoch": 3}, folder / "1" / "model.pth")
    model = load_model(
        folder / "1" / "model.pth", ModelConfig(device="cpu", options={"class": "Pair"}, base_path=folder)
    )
    assert model.input_names() == ["x"]
    assert [o.name for o in model.outputs] == ["output_0", "output_1"]


def exported(tmp_path: Path) -> Path:
    folder = tmp_path / "ep" / "1"
    folder.mkdir(parents=True)
    classes = import_source(tmp_path / "src", ONLY_CLASSIFIER)
    torch.export.save(torch.export.export(classes.Classifier(), (torch.zeros(2, 4),)), folder / "model.pt2")
    return folder / "model.pt2"


def rewrite(archive: Path, edit) -> None:
    """Rewrite a zip archive's members through ``edit(inner_name, data) -> data``."""
    with zipfile.ZipFile(archive) as source:
        members = [(info, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(archive, "w") as target:
        for info, data in members:
            target.writestr(info, edit(info.filename.split("/", 1)[1], data))


class Boom:
    marker: Path

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_export_archives_with_pickled_weights_are_refused(tmp_path):
    archive = exported(tmp_path)
    check_export_archive(archive)  # a plain archive passes

    def pickled(name, data):
        if name.endswith("weights_config.json"):
            config = json.loads(data)
            for meta in config["config"].values():
                meta["use_pickle"] = True
            return json.dumps(config).encode()
        return data

    rewrite(archive, pickled)
    with pytest.raises(ValueError, match="pickled Python object"):
        check_export_archive(archive)


def test_export_archives_with_pickled_sample_inputs_run_no_code(servekit_app, tmp_path):
    archive = exported(tmp_path)
    Boom.marker = tmp_path / "unpickled"
    payload = io.BytesIO()
    torch.save(((Boom(),), {}), payload)
    rewrite(archive, lambda name, data: payload.getvalue() if name.startswith("data/sample_inputs/") else data)
    _, body = call(servekit_app(tmp_path / "ep"), "GET", "/v1/models/ep")
    assert "sample inputs that are not plain tensors" in body["model_version_status"][0]["status"]["error_message"]
    assert not Boom.marker.exists()


def test_a_pickled_module_is_not_a_state_dict(tmp_path):
    folder = state_dict_folder(tmp_path, "Pair", "")
    with open(folder / "1" / "model.pth", "wb") as f:
        pickle.dump({"x": 1}, f)
    with pytest.raises(ValueError, match="not a file torch.save wrote|only tensors"):
        load_model(folder / "1" / "model.pth", ModelConfig(device="cpu", options={"class": "Pair"}, base_path=folder))


# -- explain without captum, and requests that cannot be explained -------------------------


def test_explain_without_captum_is_a_clear_501(servekit_app, tmp_path, monkeypatch):
    folder = state_dict_folder(tmp_path, "Pair", "options: {class: Pair}\n")
    client = servekit_app(folder)
    monkeypatch.setitem(sys.modules, "captum", None)
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    status, body = call(client, "POST", "/v1/models/m:explain", json={"instances": ROWS})
    assert status == 501
    assert "captum" in body["error"] and "servekit[torch-explain]" in body["error"]


def test_explain_needs_a_floating_input_and_a_valid_target(servekit_app, tmp_path):
    folder = state_dict_folder(tmp_path, "Embedder", "options: {class: Embedder}\n")
    client = servekit_app(folder)
    status, body = call(client, "POST", "/v1/models/m:explain", json={"inputs": {"ids": [[1, 2]], "weights": [[1, 0]]}})
    assert status == 400 and "attributes floating inputs" in body["error"], body
    status, body = call(
        client,
        "POST",
        "/v1/models/m:explain",
        json={"inputs": {"ids": [[1, 2]], "weights": [[1.0, 0.5]]}, "parameters": {"target": 7}},
    )
    assert status == 400 and "between 0 and 2" in body["error"]


# -- torch stays out of other models' processes ------------------------------------------------


def test_a_sklearn_only_flow_imports_no_torch(tmp_path):
    fit_regressor(tmp_path / "linear")
    script = textwrap.dedent(f"""
        import sys
        from servekit.server.app import create_app
        from servekit.server.settings import Settings

        app = create_app(Settings(paths=[{str(tmp_path)!r}], poll_interval=0), start=False)
        app.extensions["servekit"].repository.load_now()
        response = app.test_client().post("/v1/models/linear:predict", json={{"instances": [[1.0, 2.0]]}})
        assert response.status_code == 200, response.get_data(as_text=True)
        response.close()
        print("torch" in sys.modules, "servekit_torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # the torch plugin is registered (imported), but torch itself never is
    assert done.stdout.split()[-2:] == ["False", "True"]


def test_every_hook_survives_importing_the_submodules():
    """A submodule named like a hook would shadow the hook function once imported."""
    import importlib
    import inspect

    import servekit_torch

    for name in ("attributions", "inference", "loading", "served", "signature", "tensors"):
        importlib.import_module(f"servekit_torch.{name}")
    for hook in ("load", "unload", "metadata", "predict", "explain"):
        assert inspect.isfunction(getattr(servekit_torch, hook)), hook


def test_named_tuples_name_their_outputs():
    from collections import namedtuple

    from servekit_torch.inference import named_outputs
    from servekit_torch.served import TorchModel

    Result = namedtuple("Result", ["logits", "mean"])
    model = TorchModel(module=None, form="state_dict", device=CPU, inputs=[], output_kind="tuple", outputs=[])
    outputs = named_outputs(model, Result(torch.ones(2, 3), torch.zeros(2)))
    assert list(outputs) == ["logits", "mean"]
    assert list(named_outputs(model, (torch.ones(1), torch.ones(1)))) == ["output_0", "output_1"]
