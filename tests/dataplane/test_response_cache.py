"""The response cache in one process: its settings, LRU in bytes, and a replaced version's entries.

The cache shared by two workers is shown through a real server in
``tests/e2e/test_response_cache_workers.py``.
"""

from __future__ import annotations

import json

import pytest
from servekit.folders import triton_config as triton_model_config
from servekit.folders.servekit_yaml import ConfigError, parse_model_config

#: Each call answers how many calls this load of the model has run, so a cached answer is told apart.
COUNTING_MODEL = """
import numpy as np
import servekit

CALLS = []


@servekit.hookimpl
def load(path):
    return "counting"


@servekit.hookimpl
def predict(inputs, parameters):
    CALLS.append(1)
    x = inputs["x"] if isinstance(inputs, dict) else inputs
    return {"calls": np.array([len(CALLS)], dtype=np.int64), "x": np.asarray(x, dtype=np.float64)}
"""


def _model(tmp_path, cache_yaml: str):
    folder = tmp_path / "counting"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(COUNTING_MODEL)
    (folder / "servekit.yaml").write_text(cache_yaml)
    return folder


def _calls(client, value: float, **parameters) -> int:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [value]}]}
    if parameters:
        body["parameters"] = parameters
    answer = client.post("/v2/models/counting/infer", data=json.dumps(body), content_type="application/json")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    (out,) = [o for o in answer.get_json()["outputs"] if o["name"] == "calls"]
    return int(out["data"][0])


def test_same_inputs_and_parameters_hit_others_miss(servekit_app, tmp_path):
    client = servekit_app(_model(tmp_path, "cache: true\n"))
    assert _calls(client, 1.0) == 1
    assert _calls(client, 1.0) == 1  # from the cache
    assert _calls(client, 2.0) == 2
    assert _calls(client, 1.0, note="other") == 3  # parameters are part of the key


def _written(client) -> None:
    """Until the answers handed to the cache's writer thread are in the shared file (evictions done)."""
    client.application.extensions["servekit"].response_cache.wait_written()


def test_least_recently_used_entries_go_past_the_byte_budget(servekit_app, tmp_path):
    # one answer pickles to about 220 bytes: the budget holds two of them, not three
    client = servekit_app(_model(tmp_path, "cache: {max_bytes: 500}\n"))
    assert [_calls(client, v) for v in (1.0, 2.0, 1.0)] == [1, 2, 1]  # 1.0 is now the more recent
    assert _calls(client, 3.0) == 3  # evicts 2.0, the least recently used
    _written(client)
    assert _calls(client, 1.0) == 1
    assert _calls(client, 2.0) == 4


def test_a_replaced_version_answers_anew_and_its_entries_go(servekit_app, tmp_path):
    folder = _model(tmp_path, "cache: true\n")
    client = servekit_app(folder)
    assert [_calls(client, 1.0), _calls(client, 1.0)] == [1, 1]
    dp = client.application.extensions["servekit"]
    assert dp.response_cache.usage()[0] == 1
    (folder / "servekit.yaml").write_text("cache: true\noptions: {changed: 1}\n")
    dp.repository.sync()  # new settings: version 1 loads again and replaces the one that answered
    assert dp.response_cache.usage()[0] == 0
    assert _calls(client, 1.0) == 1
    assert _calls(client, 1.0) == 1


def test_sequences_are_never_cached(servekit_app, tmp_path):
    client = servekit_app(_model(tmp_path, "cache: true\nsequence: true\n"))
    assert _calls(client, 1.0, sequence_id=7, sequence_start=True) == 1
    assert _calls(client, 1.0, sequence_id=7) == 2


@pytest.mark.parametrize(
    ("raw", "named"),
    [(5, "'cache' must be true"), ({"max_bytes": -1}, "'cache.max_bytes'"), ({"size": 10}, "'cache' must be true")],
)
def test_bad_cache_settings_are_named(raw, named):
    with pytest.raises(ConfigError, match=named):
        parse_model_config({"cache": raw})


def test_triton_response_cache_reads_as_the_cache_setting():
    assert triton_model_config.response_cache({"response_cache": {"enable": True}}) == {}
    assert triton_model_config.response_cache({"response_cache": {"enable": False}}) is None
    with pytest.raises(triton_model_config.TritonConfigError, match="response_cache"):
        triton_model_config.response_cache({"response_cache": {"enable": "maybe"}})
