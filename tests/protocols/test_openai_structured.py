"""Structured outputs and tool calling on the OpenAI routes, with models whose answers are known.

``echo`` decodes under no grammar, so every structured-output field it is sent is
refused with a 400 naming it (never answered as free text); ``tooly`` shows Hermes'
tool-call format in its chat template and replies with a call, so ``tool_choice:
auto`` finds it, whole and streamed.  Constrained decoding itself runs in
tests/e2e/test_structured_outputs.py against a real model.
"""

from __future__ import annotations

import json

import pytest
from generative_models import ECHO_MODEL_PY, TOOL_MODEL_PY, write_model
from test_openai_protocol import BufferedClient, chunks

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    base = tmp_path_factory.mktemp("structured-repo")
    write_model(base / "echo", ECHO_MODEL_PY)
    write_model(base / "tooly", TOOL_MODEL_PY)
    app = create_app(Settings(paths=[str(base)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield BufferedClient(app.test_client())
    app.extensions["servekit"].repository.stop()


#: every structured-output field, each asking for something (the same on both routes)
CONSTRAINTS = [
    ("response_format", {"type": "json_object"}, "response_format"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}, "response_format"),
    ("guided_json", SCHEMA, "guided_json"),
    ("guided_regex", "[a-z]+", "guided_regex"),
    ("guided_choice", ["yes", "no"], "guided_choice"),
    ("guided_grammar", 'root ::= "a"', "guided_grammar"),
    ("structured_outputs", {"json": SCHEMA}, "structured_outputs.json"),
    ("structured_outputs", {"regex": "[0-9]"}, "structured_outputs.regex"),
    ("structured_outputs", {"choice": ["x"]}, "structured_outputs.choice"),
    ("structured_outputs", {"grammar": 'root ::= "a"'}, "structured_outputs.grammar"),
    ("structured_outputs", {"json_object": True}, "structured_outputs.json_object"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("field", "value", "param"), CONSTRAINTS, ids=[c[2] + str(i) for i, c in enumerate(CONSTRAINTS)]
)
def test_a_model_that_cannot_decode_under_a_grammar_answers_400_naming_the_field(
    client, route, stream, field, value, param
):
    """Never the free text a model without constrained decoding would write (the completions
    route used to answer it, 200, as if the schema had been followed)."""
    base = {"prompt": "hi"} if route == "/v1/completions" else {"messages": ASK}
    r = client.post(route, json={"model": "echo", **base, field: value, "stream": stream})
    assert r.status_code == 400, r.text
    assert r.json["error"]["param"] == param
    assert "cannot decode under a grammar" in r.json["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"response_format": {"type": "xml"}}, "response_format", "must be text, json_object or json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema' must be an object"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format", "name"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty list of strings"),
        ({"guided_regex": 5}, "guided_regex", "non-empty string"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "not supported"),
        ({"structured_outputs": []}, "structured_outputs", "must be an object"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one structured-output constraint"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend", "not supported"),
        ({"structural_tag": "{}"}, "structural_tag", "not supported"),
    ],
)
def test_structured_output_fields_are_checked_before_the_model_runs(client, body, param, fragment):
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "hi", **body})
    assert r.status_code == 400, r.text
    assert r.json["error"]["param"] == param and fragment in r.json["error"]["message"]


def test_response_format_text_changes_nothing(client):
    plain = client.post("/v1/chat/completions", json={"model": "echo", "messages": ASK}).json
    text = client.post(
        "/v1/chat/completions", json={"model": "echo", "messages": ASK, "response_format": {"type": "text"}}
    ).json
    assert text["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "letters, digits"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "appears twice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "must be none, auto, required"),
        ({"tool_choice": "required"}, "tool_choice", "has no 'tools'"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in 'tools'",
        ),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ],
)
def test_tool_fields_are_checked(client, body, param, fragment):
    r = client.post("/v1/chat/completions", json={"model": "tooly", "messages": ASK, **body})
    assert r.status_code == 400, r.text
    assert r.json["error"]["param"] == param and fragment in r.json["error"]["message"]


def test_auto_on_a_model_whose_template_shows_no_tool_format_answers_400(client):
    """The echo model has no chat template: its calls could not be found in its text."""
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": ASK, "tools": [WEATHER]})
    assert r.status_code == 400 and r.json["error"]["param"] == "tools"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_on_a_model_without_constrained_decoding_answers_400(client, choice):
    body = {"model": "tooly", "messages": ASK, "tools": [WEATHER], "tool_choice": choice}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json["error"]["param"] == "tool_choice"


def test_auto_reads_the_model_s_call_into_tool_calls(client):
    r = client.post("/v1/chat/completions", json={"model": "tooly", "messages": ASK, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tool_choice_none_presents_no_tools_and_reads_no_calls(client):
    body = {"model": "tooly", "messages": ASK, "tools": [WEATHER], "tool_choice": "none"}
    message = client.post("/v1/chat/completions", json=body).json["choices"][0]["message"]
    assert message["content"] == "It is sunny." and "tool_calls" not in message


def test_a_tool_s_answer_in_the_history_reaches_the_template(client):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.post("/v1/chat/completions", json={"model": "tooly", "messages": history, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    choice = r.json["choices"][0]
    assert choice["message"]["content"] == "It is sunny." and choice["finish_reason"] == "stop"
    bad = [*history[:2], {"role": "tool", "content": "sunny"}]
    r = client.post("/v1/chat/completions", json={"model": "tooly", "messages": bad})
    assert r.status_code == 400 and "tool_call_id" in r.json["error"]["message"]


def test_a_streamed_call_arrives_as_tool_call_deltas_after_the_content(client):
    body = {"model": "tooly", "messages": ASK, "tools": [WEATHER], "stream": True}
    got = chunks(client.post("/v1/chat/completions", json=body))
    deltas = [c["choices"][0]["delta"] for c in got if c["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert content == "Let me look."
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert got[-1]["choices"][0]["finish_reason"] == "tool_calls"
