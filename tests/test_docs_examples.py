"""The examples in docs/ run as written: each marked code block is read from the markdown here.

A ``<!-- example: NAME -->`` line before a fenced block makes it (part of) the
``model.py`` of a model named NAME (blocks of one name join, in order, into one
file, as a reader combines a page's hooks); ``<!-- example: NAME plugin -->``
makes it a ``--plugin`` file beside a model, ``<!-- example: NAME commands -->`` a shell
block whose ``servekit plugins`` lines run as written. ``<!-- fragment: why -->`` marks a
block that is no whole file. Every Python block of docs/hooks.md carries one of
the two, and every example has a scenario below, so a doc edit is tested.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKED = re.compile(r"<!-- (example|fragment): ?([^>]*?) -->\n```(\w+)\n(.*?)```", re.S)
PAGES_ALL_MARKED = ("hooks.md", "writing-plugins.md", "openai.md")


def examples() -> dict[str, dict[str, str]]:
    """NAME -> {"kind": "model.py" | "plugin", "source": the joined blocks} over every page of docs/."""
    found: dict[str, dict[str, str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for what, label, _lang, code in MARKED.findall(page.read_text()):
            if what != "example":
                continue
            name, _, kind = label.partition(" ")
            if kind == "commands":
                name = f"{name} commands"
            entry = found.setdefault(name, {"kind": kind or "model.py", "source": ""})
            entry["source"] += code + "\n"
    return found


EXAMPLES = examples()


@pytest.mark.parametrize("page", PAGES_ALL_MARKED)
def test_every_python_block_is_an_example_or_a_fragment(page):
    text = (DOCS / page).read_text()
    blocks = len(re.findall(r"^```python\n", text, re.M))
    marked = len([m for m in MARKED.findall(text) if m[2] == "python"])
    assert blocks and marked == blocks, f"{page}: {blocks - marked} Python block(s) without an example/fragment mark"


def test_every_example_has_a_scenario():
    assert set(EXAMPLES) == set(SCENARIOS)


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
