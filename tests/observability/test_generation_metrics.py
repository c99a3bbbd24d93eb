"""Generation metrics for any generative model (a ``model.py`` with a ``complete`` hook), in-process:
each choice counts once on ``/metrics`` under servekit's and vLLM's names, whole or streamed; a
stream the client leaves counts as aborted; a whole answer carries TGI's timing headers, those the
model did not measure left out.

The model is ``ECHO_MODEL_PY``: its pieces and token counts are known exactly.
"""

from __future__ import annotations

import pytest
from generative_models import ECHO_MODEL_PY, write_model
from prometheus_client.parser import text_string_to_metric_families

MODEL = "echo-signals"  # a name of its own: other tests in this process count under theirs


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    folder = write_model(tmp_path_factory.mktemp("signals") / MODEL, ECHO_MODEL_PY)
    app = create_app(Settings(paths=[str(folder.parent)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield app.test_client()
    app.extensions["servekit"].repository.stop()


def samples(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the model on ``/metrics``: (name, labels without the model's) -> value."""
    r = client.get("/metrics", buffered=True)
    out = {}
    for family in text_string_to_metric_families(r.get_data(as_text=True)):
        for s in family.samples:
            labels = dict(s.labels)
            if labels.pop("model", None) == MODEL or labels.pop("model_name", None) == MODEL:
                out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


COUNTED = [
    ("servekit_generation_time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_count"),
    ("servekit_generation_e2e_seconds_count", "vllm:e2e_request_latency_seconds_count"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_choice_counts_once_under_both_names(client, stream):
    before = samples(client)
    # "You said: hi" is three 4-character pieces, one token each; n=2 makes two choices
    body = {"model": MODEL, "prompt": "hi", "n": 2, "stream": stream}
    r = client.post("/v1/completions", json=body, buffered=True)
    assert r.status_code == 200, r.get_data(as_text=True)
    after = samples(client)
    for ours, theirs in COUNTED:
        assert delta(before, after, ours) == 2, ours
        assert delta(before, after, theirs) == 2, theirs
    assert delta(before, after, "vllm:request_success_total", finished_reason="stop") == 2
    assert delta(before, after, "servekit_generation_requests_total", finish_reason="stop") == 2
    assert delta(before, after, "vllm:generation_tokens_total") == 6
    assert delta(before, after, "servekit_generation_completion_tokens_total") == 6
    assert delta(before, after, "vllm:request_generation_tokens_count") == 2
    # the engine's series stay empty: this model runs no scheduler
    assert delta(before, after, "vllm:inter_token_latency_seconds_count") == 0


def test_a_whole_answer_has_the_timing_headers_its_model_measured(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, buffered=True)
    assert r.status_code == 200
    assert r.headers["x-generated-tokens"] == "2"
    assert r.headers["x-total-time"].isdigit()
    # the echo model measures no queue or inference time: those headers are left out, not made up
    assert "x-queue-time" not in r.headers and "x-inference-time" not in r.headers
    other = client.get("/v1/models", buffered=True)
    assert "x-total-time" not in other.headers  # no generation, no timing


def test_a_stream_the_client_leaves_counts_as_aborted(client):
    before = samples(client)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hello there, a longer one", "stream": True})
    assert r.status_code == 200
    body = r.iter_encoded()
    next(body)  # the first event, then the client goes
    r.close()
    after = samples(client)
    assert delta(before, after, "vllm:request_success_total", finished_reason="abort") == 1
    assert delta(before, after, "vllm:request_success_total", finished_reason="stop") == 0
    assert delta(before, after, "vllm:e2e_request_latency_seconds_count") == 1
