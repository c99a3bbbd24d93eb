"""The OpenAI protocol in-process: validation, response shapes, stop sequences, n,
usage, finish reasons, explanations, embeddings, and OpenAI's error shape; every
OpenAI and vLLM request field honoured or refused with a 400 naming it (the names
from the ``openai`` package's request types, the lists from
:mod:`servekit.protocols.openai_fields`, which the refusal itself reads).

The model is ``ECHO_MODEL_PY`` (no tokenizer), whose output the tests predict exactly.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import sseclient
from generative_models import ECHO_MODEL_PY, TOKENIZER_MODEL_PY, write_model
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from servekit.dataplane.generation import StopScanner, cut_at_stop
from servekit.protocols import openai_fields as fields
from sklearn_models import fit_iris


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("openai-repo")
    write_model(base / "echo", ECHO_MODEL_PY)
    write_model(base / "dashed", TOKENIZER_MODEL_PY)
    fit_iris(base / "iris")
    return base


class BufferedClient:
    """The Flask test client, closing every non-streaming response as a WSGI server does
    (an unclosed response would keep its request slot in the limits middleware)."""

    def __init__(self, client):
        self.client = client

    def get(self, *args, **kwargs):
        kwargs.setdefault("buffered", True)
        return self.client.get(*args, **kwargs)

    def post(self, *args, **kwargs):
        kwargs.setdefault("buffered", True)
        return self.client.post(*args, **kwargs)


@pytest.fixture(scope="module")
def client(repo):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[str(repo)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield BufferedClient(app.test_client())
    app.extensions["servekit"].repository.stop()


@pytest.fixture(scope="module")
def echo_only(tmp_path_factory):
    """A server with the echo model alone, so requests may leave out 'model'."""
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    folder = write_model(tmp_path_factory.mktemp("solo") / "echo", ECHO_MODEL_PY)
    app = create_app(Settings(paths=[str(folder)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    return BufferedClient(app.test_client())


def read_stream(response) -> bytes:
    """The whole SSE body; closing the response frees its slot as a real client's disconnect would."""
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    try:
        return b"".join(response.iter_encoded())
    finally:
        response.close()


def events(response) -> list[sseclient.Event]:
    return list(sseclient.SSEClient([read_stream(response)]).events())


def chunks(response) -> list[dict]:
    return [json.loads(e.data) for e in events(response) if e.data != "[DONE]"]


# -- stop sequences -----------------------------------------------------------------------


def test_stop_scanner_holds_back_a_possible_stop_across_pieces():
    scanner = StopScanner(["END"])
    assert scanner.feed("abcE") == "abc"  # "E" may start "END"
    assert scanner.feed("N") == ""
    assert scanner.feed("Dxyz") == ""
    assert scanner.stopped


def test_stop_scanner_releases_text_that_is_not_a_stop():
    scanner = StopScanner(["END", "\n\n"])
    out = scanner.feed("abcE") + scanner.feed("Nx\n") + scanner.feed("y")
    assert out + scanner.flush() == "abcENx\ny"
    assert not scanner.stopped


def test_cut_at_stop_takes_the_earliest_stop():
    assert cut_at_stop("one two three", ["three", "two"]) == ("one ", True)
    assert cut_at_stop("one", []) == ("one", False)


# -- completions -------------------------------------------------------------------------


def test_completion_shape_and_usage(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "hi there", "max_tokens": 50})
    assert r.status_code == 200, r.json
    body = r.json
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == "echo"
    assert body["choices"] == [{"index": 0, "text": "You said: hi there", "logprobs": None, "finish_reason": "stop"}]
    # no tokenizer: prompt tokens are whitespace words; completion tokens as the model reported (5 pieces)
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert r.headers["X-Request-Log-Id"]
    assert len(r.headers["X-Prediction-Log-Ids"].split(",")) == 1


def test_completion_prompt_list_and_n_make_indexed_choices(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": ["a", "b"], "n": 2})
    texts = [(c["index"], c["text"]) for c in r.json["choices"]]
    assert texts == [(0, "You said: a"), (1, "You said: a"), (2, "You said: b"), (3, "You said: b")]
    assert r.json["usage"]["prompt_tokens"] == 2  # each prompt counted once, not per choice
    assert len(r.headers["X-Prediction-Log-Ids"].split(",")) == 4


def test_completion_default_max_tokens_is_openais_16(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "x" * 100})
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["text"]) == 16 * 4


def test_completion_stop_sequence_is_cut_by_the_framework(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "alpha beta gamma", "stop": [" beta"]})
    assert r.json["choices"][0]["text"] == "You said: alpha"
    assert r.json["choices"][0]["finish_reason"] == "stop"


def test_completion_echo_prepends_the_prompt(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "hey", "echo": True})
    assert r.json["choices"][0]["text"] == "heyYou said: hey"


def test_model_may_be_left_out_when_one_model_is_served(echo_only):
    r = echo_only.post("/completions", json={"prompt": ["hello"]})
    assert r.status_code == 200
    assert r.json["choices"][0]["text"] == "You said: hello"


def test_model_is_required_when_several_are_served(client):
    r = client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 400
    assert r.json["error"]["param"] == "model"
    assert "echo" in r.json["error"]["message"]


def test_completion_explain_returns_explanations_beside_choices(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": ["one two", "three"], "explain": True})
    assert r.status_code == 200, r.json
    assert [c["text"] for c in r.json["choices"]] == ["You said: one two", "You said: three"]
    assert r.json["explanations"] == [{"words": ["one", "two"]}, {"words": ["three"]}]


def test_completion_explain_refuses_streaming(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "x", "explain": True, "stream": True})
    assert r.status_code == 400
    assert r.json["error"]["message"] == "completions with explanations do not support streaming"


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"prompt": 3}, "prompt", "string or a non-empty list"),
        ({"prompt": []}, "prompt", "string or a non-empty list"),
        ({"prompt": [1, 2, 3]}, "prompt", "no tokenizer, so it cannot read token ids"),
        ({}, "prompt", "no 'prompt'"),
        ({"prompt": "x", "temperature": 3}, "temperature", "between 0 and 2"),
        ({"prompt": "x", "temperature": "hot"}, "temperature", "must be a number"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens", "integer"),
        ({"prompt": "x", "n": 0}, "n", "between 1 and 128"),
        ({"prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
        ({"prompt": "x", "stop": [1]}, "stop", "list of strings"),
        ({"prompt": "x", "stream": "yes"}, "stream", "true or false"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", "only allowed"),
        ({"prompt": "x", "logprobs": 21}, "logprobs", "between 0 and 20"),
        ({"prompt": "x", "logprobs": -1}, "logprobs", "between 0 and 20"),
        ({"prompt": "x", "logprobs": True}, "logprobs", "integer"),
        ({"prompt": "x", "logprobs": 2, "echo": True}, "logprobs", "does not return log-probabilities"),
        ({"prompt": "x", "best_of": 3}, "best_of", "not supported"),
        ({"prompt": "x", "seed": "s"}, "seed", "integer"),
    ],
)
def test_completion_validation_errors_in_openai_shape(client, body, param, fragment):
    r = client.post("/v1/completions", json={"model": "echo", **body})
    assert r.status_code == 400
    error = r.json["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["param"] == param
    assert fragment in error["message"]


def test_errors_in_openai_shape_for_unknown_model_missing_hook_and_bad_json(client):
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and r.json["error"]["type"] == "not_found_error"
    r = client.post("/openai/v1/completions", json={"model": "iris", "prompt": "x"})
    assert r.status_code == 400 and "'iris' does not support the Completions API" in r.json["error"]["message"]
    r = client.post("/chat/completions", data=b"{not json", content_type="application/json")
    assert r.status_code == 400 and "malformed JSON" in r.json["error"]["message"]


# -- chat ----------------------------------------------------------------------------------


def test_chat_without_tokenizer_uses_the_documented_fallback_format(client):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": messages})
    assert r.status_code == 200, r.json
    choice = r.json["choices"][0]
    assert r.json["object"] == "chat.completion" and r.json["id"].startswith("chatcmpl-")
    assert choice["message"] == {
        "role": "assistant",
        "content": "You said: system: be brief\nuser: hi\nassistant:",
        "refusal": None,
        "reasoning_content": None,
    }
    assert choice["finish_reason"] == "stop"


def test_chat_uses_the_tokenizer_hook_for_template_and_usage(client):
    messages = [{"role": "system", "content": "a-b"}, {"role": "user", "content": "c"}]
    r = client.post(
        "/v1/chat/completions", json={"model": "dashed", "messages": messages, "chat_template_kwargs": {"suffix": "-!"}}
    )
    assert r.status_code == 200, r.json
    assert r.json["choices"][0]["message"]["content"] == "[system]a-b[user]c[assistant]-!"
    # the model reported no counts: the tokenizer counts "-"-separated parts
    assert r.json["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    r = client.post(
        "/v1/chat/completions", json={"model": "dashed", "messages": [{"role": "developer", "content": "x"}]}
    )
    assert r.status_code == 400
    assert "chat template rejected the messages: this template has no developer role" in r.json["error"]["message"]


def test_chat_reasoning_content(client):
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "think"}]})
    assert r.json["choices"][0]["message"]["reasoning_content"] == "pondering"


def test_chat_max_completion_tokens_and_validation(client):
    msgs = [{"role": "user", "content": "a long message to cut"}]
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": msgs, "max_completion_tokens": 2})
    assert r.json["choices"][0]["finish_reason"] == "length"
    assert r.json["usage"]["completion_tokens"] == 2
    for body, param in [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
        ({"messages": msgs, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": msgs, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": msgs, "explain": True}, "explain"),
        ({"messages": msgs, "logprobs": 1}, "logprobs"),
        ({"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": msgs, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"messages": msgs, "top_logprobs": 2}, "top_logprobs"),
    ]:
        r = client.post("/v1/chat/completions", json={"model": "echo", **body})
        assert r.status_code == 400, body
        assert r.json["error"]["param"] == param


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": "hi", "logprobs": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
    ],
)
def test_a_model_that_gives_no_logprobs_answers_400_when_asked(client, route, body, stream):
    """The echo model's hook knows nothing of logprobs: the client is told, not sent a null."""
    r = client.post(route, json={"model": "echo", "stream": stream, **body})
    assert r.status_code == 400, r.data
    assert r.json["error"]["param"] == "logprobs"
    assert "does not return log-probabilities" in r.json["error"]["message"]


def test_logprobs_left_at_their_defaults_change_nothing(client):
    msgs = [{"role": "user", "content": "hi"}]
    for route, body in [
        ("/v1/completions", {"prompt": "hi", "logprobs": None}),
        ("/v1/chat/completions", {"messages": msgs, "logprobs": False, "top_logprobs": 0}),
    ]:
        r = client.post(route, json={"model": "echo", **body})
        assert r.status_code == 200 and r.json["choices"][0]["logprobs"] is None


# -- streaming -----------------------------------------------------------------------------


def test_completion_stream_chunks_usage_done_and_metadata(client):
    r = client.post(
        "/v1/completions",
        json={
            "model": "echo",
            "prompt": "abcdefgh",
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        buffered=False,
    )
    assert r.headers["X-Request-Log-Id"]
    raw = read_stream(r)
    evs = list(sseclient.SSEClient([raw]).events())
    datas = [e.data for e in evs]
    assert datas[-1] == "[DONE]"
    parsed = [json.loads(d) for d in datas[:-1]]
    pieces = [c["choices"][0]["text"] for c in parsed if c["choices"]]
    assert "".join(pieces) == "You said: abcdefgh"
    assert all(c["object"] == "text_completion" and "usage" in c for c in parsed)
    assert parsed[-2]["choices"][0]["finish_reason"] == "stop"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 5
    trailer = raw.decode().rstrip("\n").splitlines()[-1]
    assert trailer.startswith(": servekit-metadata ")
    meta = json.loads(trailer[len(": servekit-metadata ") :])
    assert meta["requestLogId"] == r.headers["X-Request-Log-Id"]
    assert len(meta["predictionLogIds"]) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": 'quotes " \\ back\nslash \u2028 \U0001f600 \x00 é'}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 'a "b" \\ \U0001f600\n'}]}),
    ],
)
@pytest.mark.parametrize("include_usage", [True, False])
def test_streamed_pieces_are_the_bytes_the_ordinary_encoder_builds(client, path, body, include_usage):
    """Pieces of text are sent from bytes built once per choice: each event is byte for byte
    what encoding its JSON document builds (escapes, key order, usage null)."""
    from servekit.protocols.streaming import event

    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    r = client.post(path, json={"model": "echo", "stream": True, **body, **extra}, buffered=False)
    raw = read_stream(r)
    sent = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    texts = [json.loads(e[len(b"data: ") :])["choices"] for e in sent]
    assert any(c and (c[0].get("text") or c[0].get("delta", {}).get("content")) for c in texts)
    for one in sent:
        assert event(json.loads(one[len(b"data: ") :])) == one + b"\n\n"


def test_stream_stop_sequence_split_across_pieces_is_never_sent(client):
    # pieces are "You ", "said", ": ab", "cdef": the stop "bcd" spans two pieces
    r = client.post(
        "/v1/completions", json={"model": "echo", "prompt": "abcdef", "stream": True, "stop": "bcd"}, buffered=False
    )
    parsed = chunks(r)
    assert "".join(c["choices"][0]["text"] for c in parsed) == "You said: a"
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_role_first_then_deltas_then_finish(client):
    r = client.post(
        "/chat/completions",
        json={
            "model": "echo",
            "messages": [{"role": "user", "content": "think"}],
            "stream": True,
            "n": 2,
        },
        buffered=False,
    )
    parsed = chunks(r)
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in parsed)
    for index in (0, 1):
        mine = [c["choices"][0] for c in parsed if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[1]["delta"] == {"reasoning_content": "pondering"}
        text = "".join(c["delta"].get("content", "") for c in mine)
        assert text == "You said: user: think\nassistant:"
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] == "stop"


def test_stream_failure_after_first_byte_is_an_error_event(client):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "explode", "stream": True}, buffered=False)
    evs = events(r)
    errors = [e for e in evs if e.event == "error"]
    assert len(errors) == 1
    error = json.loads(errors[0].data)["error"]
    assert "exploded on purpose" in error["message"] and error["code"] == 500
    assert evs[-1].data == "[DONE]"


# -- embeddings ----------------------------------------------------------------------------


def test_embeddings_floats_and_unprefixed_top_level_embedding(client):
    r = client.post("/v1/embeddings", json={"model": "echo", "input": ["aa", "b"]})
    assert r.status_code == 200, r.json
    assert r.json["object"] == "list" and r.json["model"] == "echo"
    assert [d["embedding"] for d in r.json["data"]] == [[2.0, 2.0, 1.0], [1.0, 0.0, 1.0]]
    assert [d["index"] for d in r.json["data"]] == [0, 1]
    assert r.json["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert "embedding" not in r.json
    r = client.post("/embeddings", json={"model": "echo", "input": "aa"})
    assert r.json["embedding"] == [[2.0, 2.0, 1.0]]
    assert r.json["data"][0]["embedding"] == [2.0, 2.0, 1.0]


def test_embeddings_base64_and_dimensions(client):
    r = client.post(
        "/v1/embeddings", json={"model": "echo", "input": "aaa", "encoding_format": "base64", "dimensions": 2}
    )
    vector = np.frombuffer(base64.b64decode(r.json["data"][0]["embedding"]), dtype="<f4")
    # rows that were not unit length are truncated, not renormalised
    assert vector.tolist() == [3.0, 3.0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [[1, 2]]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 4}, "dimensions"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_embeddings_validation(client, body, param):
    r = client.post("/v1/embeddings", json={"model": "echo", **body})
    assert r.status_code == 400
    assert r.json["error"]["param"] == param


# -- models --------------------------------------------------------------------------------


def test_model_list_and_model_objects_under_every_prefix(client):
    for prefix in ("/v1", "/openai/v1", ""):
        r = client.get(f"{prefix}/models")
        assert r.status_code == 200
        assert r.json["object"] == "list"
        assert [m["id"] for m in r.json["data"]] == ["dashed", "echo", "iris"]
        assert all(m["object"] == "model" and m["owned_by"] == "servekit" for m in r.json["data"])
        r = client.get(f"{prefix}/models/echo")
        assert r.json["id"] == "echo" and r.json["object"] == "model"
        assert r.json["model_version_status"][0]["state"] == "AVAILABLE"


def test_wrong_method_on_an_openai_route_answers_in_openais_shape(tmp_path, servekit_app):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.py").write_text("import servekit\n\n@servekit.hookimpl\ndef load(path):\n    return 1\n")
    client = servekit_app(tmp_path)
    for path in ("/v1/completions", "/openai/v1/chat/completions", "/embeddings"):
        r = client.get(path)
        assert r.status_code == 405
        error = r.get_json()["error"]
        assert error["code"] == 405 and error["type"] == "invalid_request_error" and error["message"]
    r = client.get("/v1/models/m:predict")  # a V1 path keeps TF Serving's shape
    assert isinstance(r.get_json()["error"], str)


# -- fields honoured and refused, numbers, capabilities -----------------------------------

#: a value no field takes as its default
NOT_A_DEFAULT = {"servekit-test": "not a default"}

ENDPOINTS = {
    "/v1/completions": (
        fields.COMPLETION_HONOURED,
        fields.COMPLETION_REFUSED,
        {"prompt": "hello"},
        [
            completion_create_params.CompletionCreateParamsStreaming,
            completion_create_params.CompletionCreateParamsNonStreaming,
        ],
    ),
    "/v1/chat/completions": (
        fields.CHAT_HONOURED,
        fields.CHAT_REFUSED,
        {"messages": [{"role": "user", "content": "hello"}]},
        [chat_create_params.CompletionCreateParamsStreaming, chat_create_params.CompletionCreateParamsNonStreaming],
    ),
    "/v1/embeddings": (
        fields.EMBEDDING_HONOURED,
        fields.EMBEDDING_REFUSED,
        {"input": "hello"},
        [embedding_create_params.EmbeddingCreateParams],
    ),
}


def send(client, route, body, raw=None):
    if raw is not None:
        return client.post(route, data=raw, content_type="application/json", buffered=True)
    return client.post(route, json=body, buffered=True)


@pytest.mark.parametrize("route", sorted(ENDPOINTS))
def test_every_field_of_openais_request_types_is_honoured_or_refused(route):
    honoured, refused, _, types = ENDPOINTS[route]
    schema = set().union(*(t.__annotations__ for t in types))
    unlisted = schema - honoured - set(refused)
    assert not unlisted, f"{route}: decide whether to honour or refuse {sorted(unlisted)}"
    assert not honoured & set(refused)


REFUSED_CASES = [
    pytest.param(route, field, id=f"{route}-{field}")
    for route in sorted(ENDPOINTS)
    for field in sorted(ENDPOINTS[route][1])
]


@pytest.mark.parametrize(("route", "field"), REFUSED_CASES)
def test_a_field_servekit_does_not_honour_answers_400_naming_it(client, route, field):
    _, _, base, _ = ENDPOINTS[route]
    r = send(client, route, {"model": "echo", **base, field: NOT_A_DEFAULT})
    assert r.status_code == 400, r.text
    error = r.json["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert f"'{field}' is not supported by this server" in error["message"]


@pytest.mark.parametrize("route", sorted(ENDPOINTS))
def test_a_refused_field_at_its_default_changes_nothing(client, route):
    _, refused, base, _ = ENDPOINTS[route]
    model = "iris" if route == "/v1/embeddings" else "echo"  # the echo model embeds: iris answers a 400 naming it
    expected = send(client, route, {"model": model, **base})
    for field, values in refused.items():
        for value in (v for v in values if v is not fields.SAME_AS_N):
            r = send(client, route, {"model": model, **base, field: value})
            assert (r.status_code, r.json.get("error", {}).get("param")) == (
                expected.status_code,
                expected.json.get("error", {}).get("param"),
            ), f"{field}={value!r}: {r.text}"


def test_best_of_equal_to_n_changes_nothing_and_a_larger_one_is_refused(client):
    r = send(client, "/v1/completions", {"model": "echo", "prompt": "a b", "n": 2, "best_of": 2})
    assert r.status_code == 200 and len(r.json["choices"]) == 2
    r = send(client, "/v1/completions", {"model": "echo", "prompt": "a b", "n": 2, "best_of": 3})
    assert r.status_code == 400 and r.json["error"]["param"] == "best_of"


@pytest.mark.parametrize("route", sorted(ENDPOINTS))
def test_an_unknown_field_is_refused_as_openai_refuses_it(client, route):
    _, _, base, _ = ENDPOINTS[route]
    r = send(client, route, {"model": "echo", **base, "frobnicate": 1})
    assert r.status_code == 400
    error = r.json["error"]
    assert error["message"] == "Unrecognized request argument supplied: frobnicate"
    assert error["param"] == "frobnicate"


def test_explain_hands_the_other_fields_to_the_explain_hook(client):
    r = send(client, "/v1/completions", {"model": "echo", "prompt": "one two", "explain": True, "target": 1})
    assert r.status_code == 200, r.text
    assert "explanations" in r.json


# -- numbers: NaN, Infinity and ranges ------------------------------------------------

GENERATION_NUMBERS = [
    "temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k", "min_p",
    "repetition_penalty", "max_tokens", "n", "seed",
]  # fmt: skip
NON_FINITE = ["NaN", "Infinity", "-Infinity"]


@pytest.mark.parametrize("field", GENERATION_NUMBERS + ["logprobs"])
def test_a_non_finite_completion_setting_answers_400_naming_it(client, field):
    for token in NON_FINITE:
        raw = f'{{"model": "echo", "prompt": "hello", "{field}": {token}}}'.encode()
        r = send(client, "/v1/completions", None, raw=raw)
        assert r.status_code == 400, r.text
        assert r.json["error"]["param"] == field
        assert r.json["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("field", GENERATION_NUMBERS + ["max_completion_tokens", "top_logprobs"])
def test_a_non_finite_chat_setting_answers_400_naming_it(client, field):
    for token in NON_FINITE:
        raw = f'{{"model": "echo", "messages": [{{"role": "user", "content": "hi"}}], "{field}": {token}}}'.encode()
        r = send(client, "/v1/chat/completions", None, raw=raw)
        assert r.status_code == 400, r.text
        assert r.json["error"]["param"] == field


def test_a_non_finite_dimensions_answers_400(client):
    for token in NON_FINITE:
        raw = f'{{"model": "iris", "input": "x", "dimensions": {token}}}'.encode()
        r = send(client, "/v1/embeddings", None, raw=raw)
        assert r.status_code == 400 and r.json["error"]["param"] == "dimensions"


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", -2), ("top_p", 1.5), ("temperature", -0.1), ("min_p", 1.1), ("presence_penalty", 2.5)],
)
def test_sampling_ranges_are_checked_as_vllm_checks_them(client, field, value):
    r = send(client, "/v1/completions", {"model": "echo", "prompt": "hello", field: value})
    assert r.status_code == 400 and r.json["error"]["param"] == field


@pytest.mark.parametrize("top_k", [-1, 0, 5])
def test_top_k_off_or_positive_is_accepted(client, top_k):
    assert send(client, "/v1/completions", {"model": "echo", "prompt": "hello", "top_k": top_k}).status_code == 200


# -- capabilities ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "model", "api"),
    [
        ("/v1/completions", {"prompt": "x"}, "iris", "Completions"),
        ("/v1/completions", {"prompt": "x", "stream": True}, "iris", "Completions"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "iris", "Chat Completions"),
        ("/v1/embeddings", {"input": "x"}, "dashed", "Embeddings"),
    ],
)
def test_an_api_the_model_lacks_answers_400_naming_the_model(client, route, body, model, api):
    r = send(client, route, {"model": model, **body})
    assert r.status_code == 400, r.text
    error = r.json["error"]
    assert error["param"] == "model"
    assert error["message"].startswith(f"The model {model!r} does not support the {api} API")
