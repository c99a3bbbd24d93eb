"""Triton's generate extension in-process: ``/v2/models/NAME/generate`` and ``.../generate_stream``.

The generative model is ``ECHO_MODEL_PY`` (its text is predictable: "You said: "
and the prompt, in pieces of 4 characters, one token each); iris is the model
that does not generate.  The tiny GPT-2 through a real server, and gRPC, are in
``test_triton_generate_server.py``.
"""

from __future__ import annotations

import json

import pytest
from generative_models import ECHO_MODEL_PY, write_model
from servekit.errors import BadRequest
from servekit.protocols import generate_requests as gr
from sklearn_models import fit_iris


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("generate-repo")
    write_model(base / "echo", ECHO_MODEL_PY)
    fit_iris(base / "iris")
    return base


@pytest.fixture(scope="module")
def client(repo):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[str(repo)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield app.test_client()
    app.extensions["servekit"].repository.stop()


def sse_events(response) -> list[tuple[str | None, dict]]:
    """``(event name, data)`` for each event of an SSE body (comments skipped)."""
    events = []
    for block in response.get_data().decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "".join(line[6:] for line in lines if line.startswith("data: "))
        events.append((name, json.loads(data)))
    return events


def test_generate_answers_triton_shape_and_the_openai_text(client):
    body = {"text_input": "hello there", "parameters": {"max_tokens": 100, "temperature": 0}}
    r = client.post("/v2/models/echo/generate", json=body, buffered=True)
    assert r.status_code == 200, r.json
    assert r.json == {"model_name": "echo", "model_version": "1", "text_output": "You said: hello there"}
    openai = client.post(
        "/v1/completions", json={"model": "echo", "prompt": "hello there", "max_tokens": 100}, buffered=True
    )
    assert r.json["text_output"] == openai.json["choices"][0]["text"]
    versioned = client.post("/v2/models/echo/versions/1/generate", json=body, buffered=True)
    assert versioned.json == r.json


def test_generate_stream_sends_one_event_per_piece(client):
    body = {"text_input": "hello there", "max_tokens": 100}  # a top-level setting, TensorRT-LLM's way
    r = client.post("/v2/models/echo/generate_stream", json=body, buffered=True)
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    events = sse_events(r)
    assert all(name is None for name, _ in events)
    texts = [data["text_output"] for _, data in events]
    assert texts == ["You ", "said", ": he", "llo ", "ther", "e"]
    assert all(data.keys() == {"model_name", "model_version", "text_output"} for _, data in events)
    assert b": servekit-metadata" in r.get_data()  # the request log's trailer, as every stream


def test_settings_reach_the_model_from_every_place_they_can_come(client):
    for body in (
        {"text_input": "abcdefghijkl", "max_tokens": 2},
        {"text_input": "abcdefghijkl", "parameters": {"max_tokens": 2}},
        {"text_input": "abcdefghijkl", "sampling_parameters": json.dumps({"max_tokens": 2})},
        {"text_input": "abcdefghijkl", "parameters": {"sampling_parameters": '{"max_tokens": 2}'}},
    ):
        r = client.post("/v2/models/echo/generate", json=body, buffered=True)
        assert r.status_code == 200, (body, r.json)
        assert r.json["text_output"] == "You said", body


def test_stop_sequences_cut_whole_and_streamed_text(client):
    body = {"text_input": "hello there", "parameters": {"max_tokens": 100, "stop": "lo t"}}
    whole = client.post("/v2/models/echo/generate", json=body, buffered=True).json["text_output"]
    assert whole == "You said: hel"
    streamed = client.post("/v2/models/echo/generate_stream", json=body, buffered=True)
    assert "".join(data["text_output"] for _, data in sse_events(streamed)) == whole
    trt = {"text_input": "hello there", "max_tokens": 100, "stop_words": ["lo t"], "bad_words": ""}
    assert client.post("/v2/models/echo/generate", json=trt, buffered=True).json["text_output"] == whole


def test_additional_outputs_and_the_prompt_when_asked_for(client):
    body = {
        "text_input": "abcdefghijkl",
        "max_tokens": 3,
        "return_finish_reason": True,
        "return_num_output_tokens": True,
        "exclude_input_in_output": False,
    }
    r = client.post("/v2/models/echo/generate", json=body, buffered=True)
    assert r.json["text_output"] == "abcdefghijklYou said: ab"
    assert r.json["finish_reason"] == "length" and r.json["num_output_tokens"] == 3
    events = [data for _, data in sse_events(client.post("/v2/models/echo/generate_stream", json=body, buffered=True))]
    assert [e["text_output"] for e in events] == ["You ", "said", ": ab", ""]  # streams never repeat the prompt
    assert [e["finish_reason"] for e in events] == [None, None, None, "length"]
    # the echo model counts only at the end and has no tokenizer: earlier pieces are word estimates
    assert all(isinstance(e["num_output_tokens"], int) and e["num_output_tokens"] >= 0 for e in events)


def test_stream_false_gets_one_event_with_the_whole_text(client):
    body = {"text_input": "hello there", "max_tokens": 100, "stream": False}
    events = sse_events(client.post("/v2/models/echo/generate_stream", json=body, buffered=True))
    assert [data["text_output"] for _, data in events] == ["You said: hello there"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"text_input": "x", "parameters": {"max_tokens": 2, "beam_search": True}}, "beam_search"),
        ({"text_input": "x", "frobnicate": 1, "wobble": 2}, "frobnicate, wobble"),
        ({"text_input": "x", "max_tokens": 0}, "at least 1"),
        ({"text_input": "x", "temperature": "hot"}, "must be a number"),
        ({"text_input": "x", "max_tokens": 2, "parameters": {"max_tokens": 3}}, "given twice"),
        ({"text_input": "x", "sampling_parameters": "{not json"}, "sampling_parameters"),
        ({"text_input": "x", "n": 2}, "'n' must be 1"),
        ({"text_input": "x", "beam_width": 4}, "beam_width"),
        ({"text_input": "x", "stream": "yes"}, "true or false"),
        ({"text_input": 3}, "text_input"),
        ({"parameters": {}}, "text_input"),
        ({"text_input": "x", "parameters": [1]}, "'parameters' must be an object"),
    ],
)
def test_bad_requests_are_json_400s_naming_what_is_wrong(client, body, fragment):
    for route in ("generate", "generate_stream"):
        r = client.post(f"/v2/models/echo/{route}", json=body, buffered=True)
        assert r.status_code == 400, (route, r.get_data())
        assert r.mimetype == "application/json"
        assert fragment in r.json["error"], r.json


def test_a_model_that_does_not_generate_is_a_400_naming_it(client):
    for route in ("generate", "generate_stream"):
        r = client.post(f"/v2/models/iris/{route}", json={"text_input": "x"}, buffered=True)
        assert r.status_code == 400 and r.mimetype == "application/json"
        assert "'iris' is not a generative model" in r.json["error"]


def test_unknown_model_and_bad_json_are_json_errors(client):
    r = client.post("/v2/models/nope/generate", json={"text_input": "x"}, buffered=True)
    assert r.status_code == 404 and "nope" in r.json["error"]
    r = client.post("/v2/models/echo/generate_stream", data=b"{oops", content_type="application/json", buffered=True)
    assert r.status_code == 400 and "error" in r.json


def test_a_failure_after_the_first_piece_is_an_error_event(client):
    r = client.post("/v2/models/echo/generate_stream", json={"text_input": "explode", "max_tokens": 50}, buffered=True)
    assert r.status_code == 200
    events = sse_events(r)
    assert events[0] == (None, {"model_name": "echo", "model_version": "1", "text_output": "You "})
    name, data = events[-1]
    assert name == "error" and "exploded on purpose" in data["error"]


def test_read_merges_and_checks():
    spec = gr.read("p", {"max_tokens": 5, "random_seed": 7}, {"temperature": 0.5, "top_k": 3, "ignore_eos": True})
    request = spec.request(stream=True)
    assert (request.max_tokens, request.seed, request.temperature) == (5, 7, 0.5)
    assert request.options == {"top_k": 3, "ignore_eos": True} and request.stream
    assert gr.read("p", {}, {}).sampling.max_tokens == gr.DEFAULT_MAX_TOKENS
    assert gr.read("p", {}, {"priority": 0, "timeout": 0}).sampling.options == {}  # unset: tritonclient's defaults
    with pytest.raises(BadRequest, match="'priority' is not supported"):  # a scheduler servekit does not have
        gr.read("p", {}, {"priority": 2})
    with pytest.raises(BadRequest, match="ignore_eos"):
        gr.read("p", {}, {"ignore_eos": "yes"})


def test_numbers_and_switches_may_be_spelled_as_strings():
    spec = gr.read("p", {}, {"temperature": "0.5", "max_tokens": "7", "ignore_eos": "true", "stream": "false"})
    assert (spec.sampling.temperature, spec.sampling.max_tokens, spec.stream) == (0.5, 7, False)
    assert spec.sampling.options == {"ignore_eos": True}
    with pytest.raises(BadRequest, match="'temperature' must be a number"):
        gr.read("p", {}, {"temperature": "hot"})
