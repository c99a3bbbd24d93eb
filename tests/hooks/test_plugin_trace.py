"""SERVEKIT_TRACE_PLUGINS=1: every hook call is logged with its arguments and result."""

from __future__ import annotations

import logging
import textwrap

import pytest

MODEL_PY = textwrap.dedent("""
    import servekit

    @servekit.hookimpl
    def load(path):
        return {"factor": 7}

    @servekit.hookimpl
    def predict(inputs, model):
        return [int(row * model["factor"]) for row in inputs]
""")


def _serve(tmp_path, servekit_app):
    folder = tmp_path / "times7"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_PY)
    return servekit_app(tmp_path)


def _trace_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "servekit.plugins.trace"]


def test_tracing_logs_each_hook_call_with_its_arguments_and_result(tmp_path, servekit_app, monkeypatch, caplog):
    monkeypatch.setenv("SERVEKIT_TRACE_PLUGINS", "1")
    caplog.set_level(logging.INFO, logger="servekit.plugins.trace")
    client = _serve(tmp_path, servekit_app)
    caplog.clear()
    answer = client.post("/v1/models/times7:predict", json={"instances": [6]})
    assert answer.get_json() == {"predictions": [42]}

    lines = _trace_lines(caplog)
    call = next(line for line in lines if line.lstrip().startswith("predict [hook]"))
    assert "model: {'factor': 7}" in call and "inputs:" in call
    assert any(line.lstrip().startswith("finish predict --> [42]") for line in lines), lines


def test_loading_is_traced_too(tmp_path, servekit_app, monkeypatch, caplog):
    monkeypatch.setenv("SERVEKIT_TRACE_PLUGINS", "1")
    caplog.set_level(logging.INFO, logger="servekit.plugins.trace")
    _serve(tmp_path, servekit_app)
    lines = _trace_lines(caplog)
    # pluggy's tracer prints a dict result as indented key: value lines
    finish = next(line for line in lines if line.lstrip().startswith("finish load -->"))
    assert "factor: 7" in finish


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_no_tracing_unless_asked(tmp_path, servekit_app, monkeypatch, caplog, value):
    if value is None:
        monkeypatch.delenv("SERVEKIT_TRACE_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("SERVEKIT_TRACE_PLUGINS", value)
    caplog.set_level(logging.INFO, logger="servekit.plugins.trace")
    client = _serve(tmp_path, servekit_app)
    assert client.post("/v1/models/times7:predict", json={"instances": [6]}).get_json() == {"predictions": [42]}
    assert _trace_lines(caplog) == []
