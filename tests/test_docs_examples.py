"""The examples in docs/ run as written: each marked code block is read from the markdown here.

A ``<!-- example: NAME -->`` line before a fenced block makes it (part of) the
``model.py`` of a model named NAME (blocks of one name join, in order, into one
file, as a reader combines a page's hooks); ``<!-- example: NAME plugin -->``
makes it a ``--plugin`` file beside a model, ``<!-- example: NAME commands -->`` a shell
block whose ``servekit plugins`` lines run as written, ``<!-- example: NAME client -->`` a
client program (tritonclient, TF Serving's API) run with this Python against a real server
that serves the models it names, its ``localhost:8080`` / ``localhost:8081`` replaced by
that server's ports (the only change made to its text), and ``<!-- example: NAME curl -->``
a shell block of ``curl`` commands run with bash against that server, the same way. ``<!-- fragment: why -->`` marks a
block that is no whole file. Every Python block of a page that has one carries one of
the two, and every example has a scenario below, so a doc edit is tested.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from framework_models import xgboost_booster
from generative_models import build_tiny_gpt2
from repo_paths import DATA, TF_DATA
from servekit.testing import ServerProcess
from sklearn_models import fit_iris, fit_regressor

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKED = re.compile(r"<!-- (example|fragment): ?([^>]*?) -->\n```(\w+)\n(.*?)```", re.S)
PYTHON_BLOCK = re.compile(r"^```python\n", re.M)
#: every page with a Python block: each of its Python blocks must be an example or a fragment
PAGES_ALL_MARKED = tuple(sorted(p.name for p in DOCS.glob("*.md") if PYTHON_BLOCK.search(p.read_text())))


def examples() -> dict[str, dict[str, str]]:
    """NAME -> {"kind": "model.py" | "plugin", "source": the joined blocks} over every page of docs/."""
    found: dict[str, dict[str, str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for what, label, _lang, code in MARKED.findall(page.read_text()):
            if what != "example":
                continue
            name, _, kind = label.partition(" ")
            if kind in ("commands", "curl"):
                name = f"{name} {kind}"
            entry = found.setdefault(name, {"kind": kind or "model.py", "source": ""})
            entry["source"] += code + "\n"
    return found


EXAMPLES = examples()


@pytest.mark.parametrize("page", PAGES_ALL_MARKED)
def test_every_python_block_is_an_example_or_a_fragment(page):
    text = (DOCS / page).read_text()
    blocks = len(PYTHON_BLOCK.findall(text))
    marked = len([m for m in MARKED.findall(text) if m[2] == "python"])
    assert blocks and marked == blocks, f"{page}: {blocks - marked} Python block(s) without an example/fragment mark"


def test_every_example_has_a_scenario():
    assert set(EXAMPLES) == set(SCENARIOS) | set(CLIENT_SCENARIOS)
    assert {name for name, e in EXAMPLES.items() if e["kind"] in ("client", "curl")} == set(CLIENT_SCENARIOS)


def _serve(tmp_path, servekit_app, name, *, files=None, model=None, config=None):
    """The example NAME as a model folder (or a plugin beside the ``model`` example), served in-process."""
    example = EXAMPLES[name]
    models = tmp_path / "models"
    target = model or name
    folder = models / target / "1"
    folder.mkdir(parents=True)
    if config:
        (folder.parent / "servekit.yaml").write_text(config)
    for file, text in (files or {}).items():
        (folder / file).write_text(text)
    plugins = []
    if example["kind"] == "plugin":
        plugin = tmp_path / f"{name.replace(' ', '_').replace('-', '_')}.py"
        plugin.write_text(example["source"])
        plugins.append(str(plugin))
        (folder / "model.py").write_text(EXAMPLES[target]["source"])
    else:
        (folder / "model.py").write_text(example["source"])
    return servekit_app(models, plugin=plugins)


def _v2(client, name, values, **parameters):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(np.shape(values)), "data": values}]}
    if parameters:
        body["parameters"] = parameters
    return client.post(f"/v2/models/{name}/infer", json=body)


def scaled(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "scaled")
    assert client.post("/v1/models/scaled:predict", json={"instances": [[1, 2]]}).get_json() == {
        "predictions": [[1.0, 2.0]]
    }
    r = _v2(client, "scaled", [[1.0, 2.0]])
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["outputs"][0]["data"] == [1.0, 2.0]


def timing(tmp_path, servekit_app, caplog, capsys):
    client = _serve(tmp_path, servekit_app, "timing", model="scaled")
    assert client.post("/v1/models/scaled:predict", json={"instances": [[3]]}).status_code == 200
    assert "predict took" in capsys.readouterr().out


def pairs(tmp_path, servekit_app, caplog):
    """The load, metadata and predict examples of one page, together: V1 rows and V2 named inputs."""
    client = _serve(tmp_path, servekit_app, "pairs", files={"weights.json": "{}"})
    r = client.post("/v1/models/pairs:predict", json={"instances": [[1, 2, 3, 4]]})
    assert (r.status_code, r.get_json()) == (200, {"predictions": [10.0]})
    r = _v2(client, "pairs", [[1, 2, 3, 4]], scale=2)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["outputs"][0]["name"] == "y"
    assert r.get_json()["outputs"][0]["data"] == [20.0]


def running_total(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "running-total", config="sequence: {max_idle_ms: 5000}\n")
    totals = []
    for step, values in enumerate(([1, 2], [3], [4])):
        flags = {"sequence_id": 7, "sequence_start": step == 0, "sequence_end": step == 2}
        r = _v2(client, "running-total", values, **flags)
        assert r.status_code == 200, r.get_json()
        totals.append(r.get_json()["outputs"][0]["data"])
    assert totals == [[3], [6], [10]]


def rows(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "rows")
    r = client.post("/v1/models/rows:predict?stream=true", json={"instances": [[1, 2], [3, 4]]})
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.get_data(as_text=True).splitlines() if line.startswith("data: {")]
    assert events[:2] == [{"predictions": 3.0}, {"predictions": 7.0}], events  # one output: its value


def features(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "features")
    r = client.post("/v1/models/features:classify", json={"examples": [{"x": 0.25}]})
    assert r.get_json() == {"results": [[["yes", 0.25], ["no", 0.75]]]}
    r = client.post("/v1/models/features:regress", json={"examples": [{"x": 1.0}]})
    assert r.get_json() == {"results": [2.5]}


def words(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "words")
    r = client.post("/v1/completions", json={"model": "words", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["choices"][0]["text"] == "hello from "


def lengths(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "lengths")
    r = client.post("/v1/embeddings", json={"model": "lengths", "input": ["a b", "c"]})
    assert r.status_code == 200, r.get_json()
    vectors = np.array([d["embedding"] for d in r.get_json()["data"]])
    assert np.allclose(vectors, [[3 / np.hypot(3, 2), 2 / np.hypot(3, 2)], [1 / np.sqrt(2), 1 / np.sqrt(2)]])


def hello(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "hello", model="scaled")
    assert client.get("/hello").get_json() == {"models": ["scaled"]}


def started(tmp_path, servekit_app, caplog):
    with caplog.at_level(logging.INFO, logger="my_plugin"):
        _serve(tmp_path, servekit_app, "started", model="scaled")
    assert "serving scaled" in caplog.text


def audit(tmp_path, servekit_app, caplog):
    client = _serve(tmp_path, servekit_app, "audit", model="scaled")
    with caplog.at_level(logging.INFO, logger="my_audit"):
        r = client.post("/v1/models/scaled:predict", json={"instances": [[1]]})
    assert r.status_code == 200
    line = json.loads(next(rec.getMessage() for rec in caplog.records if rec.name == "my_audit"))
    assert (line["model"], line["status"]) == ("scaled", 200)
    assert line["requestLogId"]


def my_hooks(tmp_path, servekit_app, caplog, capsys):
    client = _serve(tmp_path, servekit_app, "my-hooks", model="scaled")
    assert client.post("/v1/models/scaled:predict", json={"instances": [[3]]}).status_code == 200
    assert re.search(r"^scaled v1: \d+\.\d ms$", capsys.readouterr().out, re.M)


def my_hooks_commands(tmp_path, servekit_app, caplog):
    """The page's ``servekit plugins --plugin my_hooks.py``, run as written beside the page's my_hooks.py."""
    (tmp_path / "my_hooks.py").write_text(EXAMPLES["my-hooks"]["source"])
    lines = [line.split("#")[0].split() for line in EXAMPLES["my-hooks commands"]["source"].splitlines()]
    commands = [argv for argv in lines if argv[:2] == ["servekit", "plugins"]]
    assert commands
    for argv in commands:
        done = subprocess.run(
            [sys.executable, "-m", "servekit", *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert re.search(r"^my_hooks  \(.*my_hooks\.py\)\n  hooks: predict$", done.stdout, re.M), done.stdout


SCENARIOS = {
    "my-hooks": my_hooks,
    "my-hooks commands": my_hooks_commands,
    "scaled": scaled,
    "timing": timing,
    "pairs": pairs,
    "running-total": running_total,
    "rows": rows,
    "features": features,
    "words": words,
    "lengths": lengths,
    "hello": hello,
    "started": started,
    "audit": audit,
}


@pytest.mark.slow  # a model loaded per example
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_example_runs_as_written(name, tmp_path, servekit_app, caplog, capsys):
    scenario = SCENARIOS[name]
    kwargs = {"capsys": capsys} if "capsys" in scenario.__code__.co_varnames else {}
    scenario(tmp_path, servekit_app, caplog, **kwargs)


# --- client programs, against one real server ---------------------------------------------------


@pytest.fixture(scope="module")
def client_server(tmp_path_factory):
    """``servekit serve`` (two workers, HTTP and gRPC, explicit model control) with the client examples' models."""
    base = tmp_path_factory.mktemp("client_models")
    fit_regressor(base / "linear")  # input "input" FP64 [-1, 2], output "predict": 2 * x0 + 3 * x1 + 1
    fit_iris(base / "iris")
    shutil.copytree(DATA / "triton" / "simple", base / "simple")
    if importlib.util.find_spec("xgboost"):
        (base / "churn" / "1").mkdir(parents=True)
        xgboost_booster().save_model(str(base / "churn" / "1" / "model.json"))  # input "input" [-1, 4]
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        build_tiny_gpt2(base / "gpt")  # the OpenAI and generate examples' causal LM (random weights)
        # the RAG page's stack: the packaged MiniLM, a small cross-encoder and a generator (random weights)
        from generative_models import minilm_folder
        from retrieval_models import build_sequence_classifier

        shutil.copytree(minilm_folder(), base / "embedder")
        build_sequence_classifier(base / "reranker")
        build_tiny_gpt2(base / "generator")
    if importlib.util.find_spec("servekit_tensorflow") and importlib.util.find_spec("tensorflow"):
        shutil.copytree(TF_DATA / "saved_model_half_plus_two_cpu", base / "half_plus_two")  # version 123
        (base / "half_plus_two" / "servekit.yaml").write_text("labels: {stable: 123}\n")
    with ServerProcess(base, grpc_port="auto", workers=2, model_control_mode="explicit").start(timeout=300) as server:
        yield server


def _imports(source: str) -> list[str]:
    """The modules a program imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def _run_client(name: str, server: ServerProcess, cwd: Path) -> str:
    """The example NAME as a program, run with this Python against SERVER; its standard output."""
    written = EXAMPLES[name]["source"]
    source = written.replace("localhost:8080", f"127.0.0.1:{server.http_port}")
    source = source.replace("localhost:8081", f"127.0.0.1:{server.grpc_port}")
    assert source != written, f"{name} names no server address"
    program = cwd / "client.py"
    program.write_text(source)
    done = subprocess.run([sys.executable, program.name], cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_curl(name: str, server: ServerProcess) -> str:
    """The shell example NAME run with bash against SERVER; its standard output."""
    written = EXAMPLES[name]["source"]
    source = written.replace("localhost:8080", f"127.0.0.1:{server.http_port}")
    assert source != written, f"{name} names no server address"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", source], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _post(server: ServerProcess, path: str, body: dict | None = None):
    request = urllib.request.Request(server.url + path, data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.load(r)


def _numbers(text: str) -> list[float]:
    """The numbers numpy printed, in order."""
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d*)?(?:e[-+]\d+)?", text)]


def _shown(name: str, line: str) -> None:
    """LINE, as the program printed it, is what the example's comment says it prints."""
    assert f"# {line}" in EXAMPLES[name]["source"], f"{name} prints {line!r}, its comment says otherwise"


def churn(tmp_path, server):
    import xgboost as xgb

    rows = np.array([[0.1, 2.0, 3.5, 1.0], [1.2, 0.3, 0.0, 4.1]], np.float32)
    printed = _numbers(_run_client("churn", server, tmp_path))
    booster = xgboost_booster()  # the server's booster: the same fixed data, the same trees
    assert printed == pytest.approx(booster.predict(xgb.DMatrix(rows)), rel=1e-6)  # "what booster.predict answers"


def half_plus_two(tmp_path, server):
    values, _, spec = _run_client("half-plus-two", server, tmp_path).partition("\n")
    assert _numbers(values) == [2.5, 3.0]
    _shown("half-plus-two", values)
    # "name, version 123, signature_name "serving_default"": the label "stable" is version 123
    assert re.fullmatch(
        r'name: "half_plus_two"\nversion \{\n  value: 123\n\}\nsignature_name: "serving_default"\n+', spec
    )


def linear_grpc(tmp_path, server):
    out = _run_client("linear-grpc", server, tmp_path)
    assert _numbers(out) == pytest.approx([9.0, 19.0])  # 2 * x0 + 3 * x1 + 1 per row
    _shown("linear-grpc", out.strip())


def linear_binary(tmp_path, server):
    out = _run_client("linear-binary", server, tmp_path)
    assert _numbers(out) == pytest.approx([5.75, 1.0, 22.0])
    _shown("linear-binary", out.strip())


def simple_shm(tmp_path, server):
    out = _run_client("simple-shm", server, tmp_path)
    assert _numbers(out) == list(range(0, 32, 2)), out  # OUTPUT0 = INPUT0 + INPUT1, both arange(16)
    _shown("simple-shm", out.strip())


def load_and_unload(tmp_path, server):
    fit_regressor(tmp_path / "built")
    (tmp_path / "built" / "1" / "model.joblib").rename(tmp_path / "model.joblib")  # what the program opens
    assert _run_client("load-and-unload", server, tmp_path) == ""
    index = {m["name"]: m for m in _post(server, "/v2/repository/index")}
    assert index["fresh"]["state"] == "READY", index["fresh"]
    assert (index["iris"]["state"], index["iris"]["reason"]) == ("UNAVAILABLE", "unloaded"), index["iris"]
    body = {"inputs": [{"name": "input", "datatype": "FP64", "shape": [1, 2], "data": [1, 1]}]}
    for _ in range(4):  # a connection each: both workers serve it
        assert _post(server, "/v2/models/fresh/infer", body)["outputs"][0]["data"] == pytest.approx([6.0])


def _served(server: ServerProcess, name: str) -> None:
    names = [m["name"] for m in _post(server, "/v2/repository/index")]
    if name not in names:
        pytest.skip(f"this Python cannot serve {name!r} (its framework is not installed)")


def _gpt_text(server: ServerProcess) -> str:
    """What OpenAI completions answer for the generate examples' prompt and settings."""
    body = {"model": "gpt", "prompt": "hello world", "max_tokens": 12, "temperature": 0}
    return _post(server, "/v1/completions", body)["choices"][0]["text"]


def gpt_generate_curl(tmp_path, server):
    _served(server, "gpt")
    whole, _, stream = _run_curl("gpt-generate curl", server).partition("\n")
    assert json.loads(whole) == {"model_name": "gpt", "model_version": "1", "text_output": _gpt_text(server)}
    pieces = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: ")]
    # a piece holds every token that was ready when the stream's thread read (one, or all 12 on a busy machine)
    assert pieces and all(p["model_name"] == "gpt" for p in pieces)
    assert "".join(p["text_output"] for p in pieces) == _gpt_text(server)


def gpt_stream(tmp_path, server):
    _served(server, "gpt")
    assert _run_client("gpt-stream", server, tmp_path) == _gpt_text(server) + "\n"


def logprobs(tmp_path, server):
    _served(server, "gpt")
    *tokens, last = _run_client("logprobs", server, tmp_path).strip().splitlines()
    assert 1 <= len(tokens) <= 3  # three tokens, or fewer if the random model ended the text
    for line in tokens:  # 'token' logprob ['most likely', 'second']
        shown, logprob, top = re.fullmatch(r"('.*'|\".*\") (-?\d+(?:\.\d+)?) (\[.*\])", line).groups()
        assert float(logprob) <= 0 and len(ast.literal_eval(top)) == 2
        assert ast.literal_eval(top)[0] == ast.literal_eval(shown)  # greedy: the chosen token is the most likely
    values = ast.literal_eval(last)
    assert 1 <= len(values) <= 3 and all(v <= 0 for v in values)


def rag(tmp_path, server):
    _served(server, "reranker")
    printed = _run_client("rag", server, tmp_path).split("\n", 2)
    # the same steps through the raw APIs: the three nearest passages, the cross-encoder's best two
    source = EXAMPLES["rag"]["source"]
    passages = ast.literal_eval(re.search(r"passages = (\[.*?\])", source, re.S).group(1))
    question = ast.literal_eval(re.search(r"question = (\".*?\")", source).group(1))
    vectors = _post(server, "/v1/embeddings", {"model": "embedder", "input": [*passages, question]})["data"]
    index, asked = np.array([v["embedding"] for v in vectors[:-1]]), np.array(vectors[-1]["embedding"])
    nearest = [passages[i] for i in np.argsort(-(index @ asked))[:3]]
    assert set(nearest) >= {passages[1], passages[3]}  # MiniLM's real weights find the two about Paris
    body = {"model": "reranker", "query": question, "documents": nearest, "top_n": 2}
    best = [nearest[r["index"]] for r in _post(server, "/v2/rerank", body)["results"]]
    assert printed[:2] == best and len(printed) == 3  # then the generator's answer


CLIENT_SCENARIOS = {
    "rag": rag,
    "gpt-generate curl": gpt_generate_curl,
    "gpt-stream": gpt_stream,
    "logprobs": logprobs,
    "churn": churn,
    "half-plus-two": half_plus_two,
    "linear-grpc": linear_grpc,
    "linear-binary": linear_binary,
    "simple-shm": simple_shm,
    "load-and-unload": load_and_unload,
}


@pytest.mark.slow  # a server with TensorFlow, two workers; a client program per example
@pytest.mark.parametrize("name", sorted(CLIENT_SCENARIOS))
def test_the_client_example_runs_as_written(name, tmp_path, client_server):
    if EXAMPLES[name]["kind"] == "curl":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
    else:
        for module in _imports(EXAMPLES[name]["source"]):
            pytest.importorskip(module)  # the client library the page's reader installs
    CLIENT_SCENARIOS[name](tmp_path, client_server)
