"""The torch plugin end to end: a real server answers like the module called directly.

One session-scoped server serves tiny models in all three forms (TorchScript
``model.pt``, ``torch.export`` ``model.pt2``, state dict ``model.pth`` +
``model.py``) plus folders that must fail to load.  Answers on V1 (requests)
and V2 (tritonclient.http) are compared with the reference module's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests

torch = pytest.importorskip("torch")  # a Python without torch (scripts/test-pythons.sh) skips these
import tritonclient.http as httpclient
from torch_models import add_broken, build
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

ROWS = np.array([[0.5, -1.25, 2.0, 0.1], [1e-3, 3.5, -0.75, 4.0], [2.5, 0.0, 1.0, -3.0]])
OFFSET = np.array([1.0, -2.0, 0.5])
IDS = np.array([[1, 2, 3, 0, 0], [9, 8, 7, 6, 5]])
WEIGHTS = np.array([[0.5, 1.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])


@pytest.fixture(scope="session")
def torch_models(tmp_path_factory):
    base = tmp_path_factory.mktemp("torch_repo")
    marker = tmp_path_factory.mktemp("marker") / "unpickled"
    modules = build(base)
    add_broken(base, marker)
    return base, modules, marker


@pytest.fixture(scope="session")
def torch_server(torch_models):
    from servekit.testing import ServerProcess

    with ServerProcess(torch_models[0], workers=1, threads=4, strict_readiness=False) as server:
        yield server


@pytest.fixture(scope="session")
def modules(torch_models):
    return torch_models[1]


def direct(module, *args):
    """The reference answer: the module called directly on float32/int64 tensors."""
    tensors = [torch.as_tensor(a, dtype=torch.int64 if a.dtype.kind == "i" else torch.float32) for a in args]
    with torch.inference_mode():
        out = module(*tensors)
    if isinstance(out, dict):
        return {k: v.numpy() for k, v in out.items()}
    if isinstance(out, tuple):
        return [v.numpy() for v in out]
    return out.numpy()


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=60)


def same(answer, expected):
    """Equal as float32 numbers: the wire carries float32 exactly."""
    np.testing.assert_array_equal(np.asarray(answer, dtype=expected.dtype), expected)


# -- V1 ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ts_clf", "ep_clf", "sd_clf"])
def test_v1_single_tensor_rows(torch_server, modules, name):
    r = post(torch_server, f"/v1/models/{name}:predict", {"instances": ROWS.tolist()})
    assert r.status_code == 200, r.text
    same(r.json()["predictions"], direct(modules[name], ROWS))


@pytest.mark.parametrize("name", ["ts_heads", "ep_heads", "sd_heads"])
def test_v1_named_inputs_and_dict_outputs(torch_server, modules, name):
    expected = direct(modules[name], ROWS, OFFSET)
    r = post(torch_server, f"/v1/models/{name}:predict", {"inputs": {"x": ROWS.tolist(), "offset": OFFSET.tolist()}})
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    assert set(outputs) == {"scores", "total"}
    same(outputs["scores"], expected["scores"])
    same(outputs["total"], expected["total"])
    # row format: one object per instance, named as the dict's keys
    instances = [{"x": row, "offset": off} for row, off in zip(ROWS.tolist(), OFFSET.tolist())]
    rows = post(torch_server, f"/v1/models/{name}:predict", {"instances": instances}).json()["predictions"]
    same([p["scores"] for p in rows], expected["scores"])
    same([p["total"] for p in rows], expected["total"])


def test_v1_tuple_outputs_take_option_names_or_positions(torch_server, modules):
    expected = direct(modules["sd_pair"], ROWS)
    named = post(torch_server, "/v1/models/sd_pair:predict", {"inputs": ROWS.tolist()}).json()["outputs"]
    same(named["logits"], expected[0])
    same(named["mean"], expected[1])
    positional = post(torch_server, "/v1/models/ts_pair:predict", {"inputs": ROWS.tolist()}).json()["outputs"]
    assert set(positional) == {"output_0", "output_1"}
    same(positional["output_0"], expected[0])


def test_v1_integer_inputs_keep_their_type(torch_server, modules):
    r = post(
        torch_server, "/v1/models/sd_embed:predict", {"inputs": {"ids": IDS.tolist(), "weights": WEIGHTS.tolist()}}
    )
    assert r.status_code == 200, r.text
    same(r.json()["outputs"], direct(modules["sd_embed"], IDS, WEIGHTS))
    # JSON integers for a declared FP32 input are converted exactly
    r = post(
        torch_server,
        "/v1/models/sd_embed:predict",
        {"inputs": {"ids": IDS.tolist(), "weights": np.ones_like(IDS).tolist()}},
    )
    same(r.json()["outputs"], direct(modules["sd_embed"], IDS, np.ones(IDS.shape)))


def test_v1_metadata_names_inputs_by_forward_arguments(torch_server):
    def signature(name):
        r = requests.get(f"{torch_server.url}/v1/models/{name}/metadata", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]

    heads = signature("ep_heads")
    assert set(heads["inputs"]) == {"x", "offset"}
    assert heads["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in heads["inputs"]["x"]["tensor_shape"]["dim"]] == ["-1", "4"]
    assert set(heads["outputs"]) == {"scores", "total"}
    assert [d["size"] for d in heads["outputs"]["scores"]["tensor_shape"]["dim"]] == ["-1", "2"]
    # TorchScript dict outputs are learned from one call on the declared input shapes
    assert set(signature("ts_heads")["outputs"]) == {"scores", "total"}
    assert set(signature("sd_pair")["outputs"]) == {"logits", "mean"}
    embed = signature("sd_embed")
    assert embed["inputs"]["ids"]["dtype"] == "DT_INT64"
    assert [d["size"] for d in embed["outputs"]["output_0"]["tensor_shape"]["dim"]] == ["-1", "3"]
    assert set(signature("sd_clf")["inputs"]) == {"x"}


@pytest.mark.parametrize(
    "name, body, status, words",
    [
        ("ep_heads", {"inputs": {"x": ROWS.tolist(), "bias": [1.0, 2.0, 3.0]}}, 400, "unknown input(s) bias"),
        ("ep_heads", {"inputs": {"x": ROWS.tolist()}}, 400, "missing input(s) offset"),
        ("ep_heads", {"instances": ROWS.tolist()}, 400, "takes 2 inputs"),
        ("ep_clf", {"instances": [[1.0, 2.0, 3.0]]}, 400, "shape [1, 3] does not match the model's shape [-1, 4]"),
        ("ts_clf", {"instances": [[1.0, 2.0, 3.0]]}, 400, "shapes cannot be multiplied"),
        ("sd_clf", {"instances": [[1, 2, 3, 4]]}, 400, "send floats"),
        ("ep_clf", {"instances": [["a", "b", "c", "d"]]}, 400, "expected numbers, found the string 'a'"),
        ("sd_embed", {"inputs": {"ids": [[1.5, 2, 3, 0, 0]], "weights": [[1.0] * 5]}}, 400, "would change"),
        ("sd_embed", {"inputs": {"ids": [[99, 2, 3, 0, 0]], "weights": [[1.0] * 5]}}, 400, "index out of range"),
    ],
)
def test_v1_bad_inputs_are_clear_400s(torch_server, name, body, status, words):
    r = post(torch_server, f"/v1/models/{name}:predict", body)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert words in message
    assert "/" not in message.replace("mat1 and mat2", "")  # no file paths, no TorchScript traceback


def test_failed_loads_report_why_and_run_no_pickled_code(torch_server, torch_models):
    marker = torch_models[2]

    def error(name):
        status = requests.get(f"{torch_server.url}/v1/models/{name}", timeout=30).json()
        (version,) = status["model_version_status"]
        assert version["state"] == "END"
        return version["status"]["error_message"]

    assert "only tensors" in error("pickled") and "never unpickled" in error("pickled")
    assert not marker.exists()
    assert "name the model's class" in error("two_classes")
    assert "not a TorchScript archive" in error("not_script")
    assert "options.outputs names logits, sum, but forward() returns the keys scores, total" in error("misnamed_keys")
    if not torch.cuda.is_available():
        assert "device 'cuda' was requested but" in error("on_gpu")
    # the others keep serving
    assert requests.get(f"{torch_server.url}/v2/health/ready", timeout=30).status_code == 200


def test_v1_explain_matches_captum_on_the_module(torch_server, modules):
    from captum.attr import IntegratedGradients

    r = post(torch_server, "/v1/models/ep_clf:explain", {"inputs": ROWS.tolist()})
    assert r.status_code == 200, r.text
    answer = r.json()["explanations"]
    x = torch.tensor(ROWS, dtype=torch.float32)
    target = modules["ep_clf"](x).argmax(dim=1)
    expected = IntegratedGradients(modules["ep_clf"]).attribute(x, target=target, n_steps=50)
    assert answer["target"] == target.tolist()
    np.testing.assert_allclose(answer["attributions"], expected.detach().numpy(), rtol=1e-4, atol=1e-6)
    # completeness: attributions add up to f(x) - f(0) for the explained class
    out = modules["ep_clf"](x).detach().numpy()
    base = modules["ep_clf"](torch.zeros_like(x)).detach().numpy()
    gain = out[range(3), target] - base[range(3), target]
    np.testing.assert_allclose(np.sum(answer["attributions"], axis=1), gain, atol=1e-3)


def test_v1_explain_holds_integer_inputs_fixed(torch_server):
    r = post(
        torch_server,
        "/v1/models/sd_embed:explain",
        {"inputs": {"ids": IDS.tolist(), "weights": WEIGHTS.tolist()}, "parameters": {"target": 0}},
    )
    assert r.status_code == 200, r.text
    answer = r.json()["explanations"]
    assert np.asarray(answer["attributions"]).shape == WEIGHTS.shape
    assert answer["target"] == [0, 0]


# -- V2 ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def triton(torch_server):
    client = httpclient.InferenceServerClient(torch_server.url.removeprefix("http://"))
    yield client
    client.close()


def v2_input(name, array, datatype, binary):
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("name", ["ts_heads", "ep_heads", "sd_heads"])
def test_v2_infer_matches_module(triton, modules, name, binary):
    expected = direct(modules[name], ROWS, OFFSET)
    result = triton.infer(
        name,
        [
            v2_input("x", ROWS.astype(np.float32), "FP32", binary),
            v2_input("offset", OFFSET.astype(np.float32), "FP32", binary),
        ],
        outputs=[httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("scores", "total")],
    )
    np.testing.assert_array_equal(result.as_numpy("scores"), expected["scores"])
    np.testing.assert_array_equal(result.as_numpy("total"), expected["total"])


@pytest.mark.parametrize("name", ["ts_clf", "ep_clf", "sd_clf"])
def test_v2_single_input_and_fp64_request(triton, modules, name):
    # an FP64 request to a float32 model is narrowed like a JSON number
    result = triton.infer(name, [v2_input("x", ROWS, "FP64", True)])
    np.testing.assert_array_equal(result.as_numpy("output_0"), direct(modules[name], ROWS))


def test_v2_metadata_and_int64_inputs(triton, modules):
    meta = triton.get_model_metadata("sd_embed")
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("ids", "INT64", [-1, 5]),
        ("weights", "FP32", [-1, 5]),
    ]
    assert meta["platform"] == "pytorch"
    result = triton.infer(
        "sd_embed", [v2_input("ids", IDS, "INT64", True), v2_input("weights", WEIGHTS.astype(np.float32), "FP32", True)]
    )
    np.testing.assert_array_equal(result.as_numpy("output_0"), direct(modules["sd_embed"], IDS, WEIGHTS))
    assert triton.get_model_metadata("ts_clf")["platform"] == "pytorch_libtorch"


def test_v2_positional_names_and_errors(triton, modules):
    # Triton's NAME__N convention passes tensors by position
    result = triton.infer(
        "ep_heads",
        [
            v2_input("INPUT__0", ROWS.astype(np.float32), "FP32", True),
            v2_input("INPUT__1", OFFSET.astype(np.float32), "FP32", True),
        ],
    )
    np.testing.assert_array_equal(result.as_numpy("scores"), direct(modules["ep_heads"], ROWS, OFFSET)["scores"])
    with pytest.raises(InferenceServerException) as info:
        triton.infer(
            "sd_embed",
            [
                v2_input("ids", np.array([[1, 2, 3, 4, 300]], np.int64), "INT64", True),
                v2_input("weights", np.ones((1, 5), np.float16), "FP16", True),
            ],
        )
    assert "index out of range" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        triton.infer(
            "sd_embed",
            [
                v2_input("ids", np.array([[1, 2, 3, 4, 5]], np.uint64) + 2**63, "UINT64", True),
                v2_input("weights", np.ones((1, 5), np.float32), "FP32", True),
            ],
        )
    assert "out of the range of INT64" in str(info.value)


def test_v2_explain(torch_server, modules):
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": ROWS.reshape(-1).tolist()}],
        "parameters": {"n_steps": 20},
    }
    r = requests.post(f"{torch_server.url}/v2/models/sd_clf/explain", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["attributions"]["shape"] == [3, 4]
    assert outputs["target"]["datatype"] == "INT64"


def test_v2_metadata_names_a_torchscript_dicts_outputs_before_any_request(triton, modules):
    """tritonclient's examples ask for the outputs the metadata names: a traced module returning a dict
    names them at load, learned from its warm-up request (no options.inputs, no options.outputs)."""
    meta = triton.get_model_metadata("ts_heads_warm")
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("scores", "FP32", [-1, -1]),
        ("total", "FP32", [-1]),
    ]
    names = [o["name"] for o in meta["outputs"]]
    result = triton.infer(
        "ts_heads_warm",
        [
            v2_input("x", ROWS.astype(np.float32), "FP32", True),
            v2_input("offset", OFFSET.astype(np.float32), "FP32", True),
        ],
        outputs=[httpclient.InferRequestedOutput(name) for name in names],
    )
    expected = direct(modules["ts_heads_warm"], ROWS, OFFSET)
    for name in names:
        np.testing.assert_allclose(result.as_numpy(name), expected[name], rtol=1e-6)
