"""Triton's generate routes and V2 gRPC streaming of a tiny GPT-2 through a real ``servekit serve``.

Two HTTP workers (each with its gRPC server) feed one model host
(``placement: process``), so every request goes through the one continuous-batching
scheduler.  ``gpt`` batches 4 sequences; ``solo`` has room for one and no queue
(``max_num_seqs: 1``, ``max_queued: 0``): a second request while one runs is
refused with a 429, which tells when the first one left the batch; the first is
long enough that it cannot have left by finishing.
Clients: ``requests`` (SSE parsed by hand) and ``tritonclient.grpc``'s
``start_stream`` / ``async_stream_infer``.
"""

from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import requests
from generative_models import build_tiny_gpt2
from sklearn_models import fit_iris

pytestmark = pytest.mark.slow  # starts a real server

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

PROMPT = "hello world, the quick"
GREEDY = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
#: runs for a minute or more unless stopped (about 3 ms a token here, more as the context grows):
#: a stopped sequence must free its place long before it could have finished
LONG = {"max_tokens": 16000, "temperature": 1, "seed": 3, "ignore_eos": True}
FREED_WITHIN_S = 30


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("generate-server")
    gpt = build_tiny_gpt2(base / "gpt")
    (gpt / "servekit.yaml").write_text("placement: process\noptions: {max_num_seqs: 4}\n")
    solo = build_tiny_gpt2(base / "solo", n_positions=16384)
    (solo / "servekit.yaml").write_text("placement: process\noptions: {max_num_seqs: 1, max_queued: 0}\n")
    fit_iris(base / "iris")
    return base


@pytest.fixture(scope="module")
def server(repo):
    from servekit.testing import ServerProcess

    with ServerProcess(repo, workers=2, threads=8, grpc_port="auto", env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


def data_events(response) -> list[tuple[str | None, dict]]:
    """``(event name, data)`` for each SSE event as it arrives."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith(b"event: "):
            name = line[7:].decode()
        elif line.startswith(b"data: "):
            events.append((name, json.loads(line[6:])))
            name = None
    return events


def text_input(prompt: str, **tensors: tuple[str, object]) -> list:
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    for name, (datatype, value) in tensors.items():
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(np.array([value], dtype=bool if datatype == "BOOL" else object))
        inputs.append(tensor)
    return inputs


def stream_call(server, model: str, prompt: str, parameters: dict, **tensors) -> list:
    """Every response (or error) of one ModelStreamInfer request, up to its final response."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        client.async_stream_infer(
            model,
            text_input(prompt, **tensors),
            request_id="r1",
            parameters=parameters,
            enable_empty_final_response=True,
        )
        got = []
        while True:
            item = results.get(timeout=120)
            got.append(item)
            if isinstance(item, InferenceServerException):
                break
            final = item.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        client.stop_stream()
    return got


def openai_text(server, model: str, prompt: str, settings: dict) -> str:
    body = {"model": model, "prompt": prompt, **settings}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_generate_equals_the_openai_completion_and_the_stream_joins_to_it(server):
    expected = openai_text(server, "gpt", PROMPT, GREEDY)
    assert expected
    r = requests.post(
        server.url + "/v2/models/gpt/generate", json={"text_input": PROMPT, "parameters": GREEDY}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"model_name": "gpt", "model_version": "1", "text_output": expected}
    with requests.post(
        server.url + "/v2/models/gpt/generate_stream",
        json={"text_input": PROMPT, **GREEDY},
        stream=True,
        timeout=120,
    ) as streamed:
        assert streamed.headers["Content-Type"].startswith("text/event-stream")
        events = data_events(streamed)
    assert len(events) > 1  # piece by piece, not one answer
    assert all(name is None and data["model_name"] == "gpt" for name, data in events)
    assert "".join(data["text_output"] for _, data in events) == expected


def test_counts_and_finish_reason_match_the_model(server):
    body = {
        "text_input": PROMPT,
        "parameters": GREEDY,
        "return_finish_reason": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }
    whole = requests.post(server.url + "/v2/models/gpt/generate", json=body, timeout=120).json()
    assert whole["finish_reason"] == "length" and whole["num_output_tokens"] == 24
    with requests.post(server.url + "/v2/models/gpt/generate_stream", json=body, stream=True, timeout=120) as r:
        events = [data for _, data in data_events(r)]
    assert sum(e["num_output_tokens"] for e in events) == 24
    assert {e["num_input_tokens"] for e in events} == {whole["num_input_tokens"]}
    assert events[-1]["finish_reason"] == "length" and all(e["finish_reason"] is None for e in events[:-1])


def test_grpc_stream_answers_piece_by_piece_with_a_final_response(server):
    expected = openai_text(server, "gpt", PROMPT, GREEDY)
    responses = stream_call(server, "gpt", PROMPT, GREEDY)
    assert not any(isinstance(r, InferenceServerException) for r in responses), responses
    *pieces, final = responses
    assert pieces  # each holds the tokens that were ready together: how many depends on the machine's load
    assert final.as_numpy("text_output") is None  # the empty final response: parameters only
    assert final.get_response().parameters["triton_final_response"].bool_param
    for piece in pieces:
        response = piece.get_response()
        assert response.id == "r1" and response.model_name == "gpt"
        assert not response.parameters["triton_final_response"].bool_param
        assert piece.as_numpy("text_output").shape == (1,)
    assert b"".join(p.as_numpy("text_output")[0] for p in pieces).decode() == expected


def test_generate_requests_on_one_stream_run_at_once(server):
    """A short request sent after a long one on the same call finishes first: they share the batch."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        for request_id, tokens in (("long", 200), ("short", 5)):
            settings = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
            client.async_stream_infer(
                "gpt", text_input(PROMPT), request_id=request_id, parameters=settings, enable_empty_final_response=True
            )
        finals, texts = [], {"long": b"", "short": b""}
        while len(finals) < 2:
            item = results.get(timeout=120)
            assert not isinstance(item, InferenceServerException), item
            response = item.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals.append(response.id)
            else:
                texts[response.id] += item.as_numpy("text_output")[0]
        client.stop_stream()
    assert finals == ["short", "long"]
    assert texts["short"].decode() == openai_text(server, "gpt", PROMPT, {**GREEDY, "max_tokens": 5})


def test_grpc_settings_spelled_as_strings(server):
    """tritonclient before 2.4x has no float parameters: numbers may come as strings."""
    settings = {"max_tokens": 12, "temperature": 0.7, "top_p": 0.9, "seed": 5}
    expected = openai_text(server, "gpt", PROMPT, settings)
    spelled = {**settings, "temperature": "0.7", "top_p": "0.9", "seed": "5"}
    *pieces, _ = stream_call(server, "gpt", PROMPT, spelled)
    assert b"".join(p.as_numpy("text_output")[0] for p in pieces).decode() == expected


def test_grpc_settings_as_vllm_sends_them(server):
    """vLLM's clients: a ``sampling_parameters`` JSON tensor and a ``stream`` switch set to false."""
    expected = openai_text(server, "gpt", PROMPT, GREEDY)
    responses = stream_call(
        server,
        "gpt",
        PROMPT,
        {},
        sampling_parameters=("BYTES", json.dumps(GREEDY).encode()),
        stream=("BOOL", False),
    )
    whole, final = responses
    assert whole.as_numpy("text_output")[0].decode() == expected
    assert final.get_response().parameters["triton_final_response"].bool_param
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:  # unary ModelInfer
        result = client.infer("gpt", text_input(PROMPT), parameters=GREEDY)
    assert result.as_numpy("text_output")[0].decode() == expected


def test_grpc_bad_settings_and_models_that_do_not_generate(server):
    (error,) = stream_call(server, "gpt", PROMPT, {"max_tokens": 4, "beams": 3})
    assert isinstance(error, InferenceServerException) and "beams" in error.message()
    with (
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
        pytest.raises(InferenceServerException, match="beams"),
    ):
        client.infer("gpt", text_input(PROMPT), parameters={"beams": 3})


def test_http_model_that_does_not_generate_is_a_400(server):
    r = requests.post(server.url + "/v2/models/iris/generate_stream", json={"text_input": "x"}, timeout=30)
    assert r.status_code == 400 and "'iris' is not a generative model" in r.json()["error"]


def solo_refuses_a_second_request(server) -> bool:
    """Whether ``solo`` is busy: its one place is taken and it queues nothing (429)."""
    r = requests.post(server.url + "/v2/models/solo/generate", json={"text_input": "hi", "max_tokens": 2}, timeout=120)
    assert r.status_code in (200, 429), r.text
    return r.status_code == 429


def wait_until_free(server) -> None:
    deadline = time.monotonic() + FREED_WITHIN_S  # the slot frees at the scheduler's next step
    while solo_refuses_a_second_request(server):
        assert time.monotonic() < deadline, "the stopped sequence kept its place in the batch"
        time.sleep(0.05)


def test_a_disconnected_http_stream_frees_its_place(server):
    response = requests.post(
        server.url + "/v2/models/solo/generate_stream", json={"text_input": "hello", **LONG}, stream=True, timeout=120
    )
    lines = response.iter_lines()
    assert any(next(lines).startswith(b"data: ") for _ in range(4))
    assert solo_refuses_a_second_request(server)  # the stream holds the one place
    response.close()  # the client goes away mid-stream
    wait_until_free(server)
    # greedy and past the end-of-text token: a sampled answer of this random model may be that token
    # alone, an empty text
    again = {"text_input": "hello", **GREEDY, "max_tokens": 5}
    r = requests.post(server.url + "/v2/models/solo/generate", json=again, timeout=120)
    assert r.status_code == 200 and r.json()["text_output"]


def test_a_cancelled_grpc_stream_frees_its_place(server):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer("solo", text_input("hello"), parameters=LONG)
    first = results.get(timeout=120)
    assert not isinstance(first, InferenceServerException), first
    assert solo_refuses_a_second_request(server)
    client.stop_stream(cancel_requests=True)
    client.close()
    wait_until_free(server)
    responses = stream_call(server, "solo", "hello", {"max_tokens": 5, "ignore_eos": True})
    assert len(responses) > 1 and not any(isinstance(r, InferenceServerException) for r in responses)
