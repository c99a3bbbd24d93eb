"""OpenAI's Responses API in-process: the request read as the chat it becomes, the Response
object, the streamed events in order with their sequence numbers, and every field of the
``openai`` package's ``ResponseCreateParams`` honoured or refused with a 400 naming it
(nothing is stored, so state and hosted tools are refused).

The model is ``ECHO_MODEL_PY`` (no tokenizer): it replies "You said: <prompt>" in
4-character pieces, the chat formatted by the plain fallback, so every text is predictable.
"""

from __future__ import annotations

import json

import pytest
from generative_models import ECHO_MODEL_PY, write_model
from openai.types.responses import response_create_params
from servekit.protocols import openai_responses as responses_api


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    base = tmp_path_factory.mktemp("responses-repo")
    write_model(base / "echo", ECHO_MODEL_PY)
    app = create_app(Settings(paths=[str(base)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    yield app.test_client()
    app.extensions["servekit"].repository.stop()


def post(client, body, path="/v1/responses"):
    return client.post(path, json={"model": "echo", **body}, buffered=True)


def events(response):
    """The SSE events as (name, data) pairs."""
    out = []
    for block in response.get_data(as_text=True).strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def test_a_string_input_with_instructions_is_answered_as_a_response(client):
    r = post(client, {"input": "hello", "instructions": "be brief", "metadata": {"run": "7"}})
    assert r.status_code == 200, r.text
    body = r.json
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert body["model"] == "echo" and body["instructions"] == "be brief"
    assert body["metadata"] == {"run": "7"} and body["store"] is False
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "completed"
    (part,) = message["content"]
    assert part == {
        "type": "output_text",
        "text": "You said: system: be brief\nuser: hello\nassistant:",
        "annotations": [],
        "logprobs": [],
    }
    usage = body["usage"]
    assert usage["output_tokens"] == 13 and usage["total_tokens"] == usage["input_tokens"] + 13


def test_message_items_with_text_parts_become_the_chat(client):
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
        {"role": "user", "content": "three"},
    ]
    r = post(client, {"input": items})
    assert r.status_code == 200, r.text
    text = r.json["output"][0]["content"][0]["text"]
    assert text == "You said: developer: rules\nuser: one\nassistant: two\nuser: three\nassistant:"


def test_max_output_tokens_makes_the_response_incomplete(client):
    r = post(client, {"input": "a long enough input", "max_output_tokens": 2})
    body = r.json
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["output"][0]["content"][0]["text"] == "You said"
    assert body["usage"]["output_tokens"] == 2 and body["max_output_tokens"] == 2


def test_reasoning_comes_as_a_reasoning_item_before_the_message(client):
    body = post(client, {"input": "think"}).json
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "pondering"}
    ]
    assert message["type"] == "message"


def test_the_stream_sends_openais_events_in_order(client):
    r = post(client, {"input": "hello", "stream": True})
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    sent = events(r)
    names = [name for name, _ in sent]
    assert [data["type"] for _, data in sent] == names
    assert [data["sequence_number"] for _, data in sent] == list(range(len(sent)))
    deltas = names.count("response.output_text.delta")
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(data["delta"] for name, data in sent if name == "response.output_text.delta")
    assert text == "You said: user: hello\nassistant:"
    done = sent[-1][1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == text
    assert done["usage"]["output_tokens"] == deltas
    assert sent[0][1]["response"]["status"] == "in_progress"


def test_a_stream_cut_by_max_output_tokens_ends_incomplete(client):
    sent = events(post(client, {"input": "hello", "stream": True, "max_output_tokens": 1}))
    name, data = sent[-1]
    assert name == "response.incomplete" and data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_stream_that_fails_after_its_start_reports_an_error_event(client):
    sent = events(post(client, {"input": "explode", "stream": True}))
    names = [name for name, _ in sent]
    assert names[-2:] == ["error", "response.failed"]
    assert "exploded on purpose" in sent[-2][1]["message"]


# -- fields -------------------------------------------------------------------------------------

#: a value no field takes as its default
NOT_A_DEFAULT = {"servekit-test": "not a default"}


def test_every_field_of_the_openai_request_type_is_honoured_or_refused():
    types = [
        response_create_params.ResponseCreateParamsStreaming,
        response_create_params.ResponseCreateParamsNonStreaming,
    ]
    schema = set().union(*(t.__annotations__ for t in types))
    unlisted = schema - responses_api.HONOURED - set(responses_api.REFUSED)
    assert not unlisted, f"decide whether to honour or refuse {sorted(unlisted)}"
    assert not responses_api.HONOURED & set(responses_api.REFUSED)


@pytest.mark.parametrize("field", sorted(responses_api.REFUSED))
def test_a_field_needing_state_or_a_hosted_feature_answers_400_naming_it(client, field):
    r = post(client, {"input": "hello", field: NOT_A_DEFAULT})
    assert r.status_code == 400, r.text
    assert r.json["error"]["param"] == field and f"'{field}' is not supported" in r.json["error"]["message"]


def test_a_refused_field_at_its_default_changes_nothing(client):
    for field, values in responses_api.REFUSED.items():
        for value in values:
            r = post(client, {"input": "hello", field: value})
            assert r.status_code == 200, f"{field}={value!r}: {r.text}"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": "x", "instructions": 5}, "instructions"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "top_p": "high"}, "top_p"),
        ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text"),
        ({"input": "x", "text": {"colour": "red"}}, "text"),
        ({"input": "x", "text": {"verbosity": "high"}}, "text"),
        ({"input": "x", "stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
        ({"input": "x", "metadata": "tag"}, "metadata"),
        ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_input_answers_400_naming_the_field(client, body, param):
    r = post(client, body)
    assert r.status_code == 400, r.text
    assert r.json["error"]["param"] == param and r.json["error"]["type"] == "invalid_request_error"


def test_answered_under_every_openai_prefix(client):
    for path in ("/v1/responses", "/openai/v1/responses", "/responses"):
        assert post(client, {"input": "hi"}, path).status_code == 200


def test_a_chat_answer_with_tool_calls_becomes_function_call_items():
    """Chat's ``tool_calls`` (once a model calls tools) are written as the Response's function calls."""
    completion = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"c": 1}'}}
                    ],
                },
                "finish_reason": "tool_calls",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    answer = responses_api.Answer({"input": "x"}, "m")
    body = responses_api.whole(answer, completion)
    (call,) = body["output"]
    assert call["type"] == "function_call" and call["call_id"] == "call_1"
    assert (call["name"], call["arguments"], call["status"]) == ("weather", '{"c": 1}', "completed")
    assert body["status"] == "completed" and body["usage"]["total_tokens"] == 7


def test_function_tools_and_text_format_are_handed_to_chat_in_its_shape():
    chat = responses_api.chat_body(
        {
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": {"type": "function", "name": "weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
            "max_output_tokens": 9,
        }
    )
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["max_completion_tokens"] == 9
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]


def test_chats_refusal_of_tools_or_a_format_is_passed_on_in_the_responses_names(client):
    """The echo model has no chat template to read tool calls with, and decodes under no grammar:
    chat refuses ``tools`` and ``response_format``; the Responses API answers with its own names."""
    r = post(client, {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}]})
    assert r.status_code == 400 and r.json["error"]["param"] == "tools"
    r = post(client, {"input": "x", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 400 and r.json["error"]["param"] == "text"


def test_top_logprobs_from_a_model_without_them_is_refused_naming_it(client):
    r = post(client, {"input": "x", "top_logprobs": 2})
    assert r.status_code == 400 and r.json["error"]["param"] == "top_logprobs"
