"""The official ``openai`` client's ``responses.create``, whole and streamed, against a real
``servekit serve``.  The models are ``ECHO_MODEL_PY`` (it replies "You said: <prompt>" in
4-character pieces; "think" adds reasoning) and ``TOOL_MODEL_PY`` (a Hermes-style tool
caller), so every text is predictable.
"""

from __future__ import annotations

import json

import pytest
from generative_models import ECHO_MODEL_PY, TOOL_MODEL_PY, write_model
from lazy_modules import lazy_module

pytestmark = pytest.mark.slow  # starts a real server

openai = lazy_module("openai")  # looked up at collection, imported by the first test that needs it


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("responses")
    write_model(base / "echo", ECHO_MODEL_PY)
    write_model(base / "tooly", TOOL_MODEL_PY)  # calls its first tool, then answers "It is sunny."
    with ServerProcess(base) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_responses_create(client):
    response = client.responses.create(
        model="echo",
        instructions="be brief",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        temperature=0,
        top_p=1,
    )
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "You said: system: be brief\nuser: hello\nassistant:"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.output_tokens == 13
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_responses_create_cut_by_max_output_tokens(client):
    response = client.responses.create(model="echo", input="hello", max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "You said"


def test_responses_create_streamed(client):
    events = list(client.responses.create(model="echo", input="think hello", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "You said: user: think hello\nassistant:"
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == "pondering"
    final = events[-1].response
    assert final.output_text == text and [item.type for item in final.output] == ["reasoning", "message"]


def test_the_stream_helper_gathers_the_final_response(client):
    with client.responses.stream(model="echo", input="hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "You said: user: hello\nassistant:"


def test_state_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="echo", input="hi", previous_response_id="resp_123")
    assert info.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="echo", input="hi", store=True)
    assert info.value.body["param"] == "store"


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_two_turn_tool_loop(client):
    first = client.responses.create(model="tooly", input="weather in Paris?", tools=[WEATHER])
    message, call = first.output
    assert message.type == "message" and first.output_text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and first.status == "completed"
    second = client.responses.create(
        model="tooly",
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
    )
    assert second.output_text == "It is sunny." and [item.type for item in second.output] == ["message"]


def test_a_streamed_tool_call(client):
    events = list(client.responses.create(model="tooly", input="weather?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert text == "Let me look." and json.loads(arguments) == {"city": "Paris"}
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.completed")
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].name == "get_weather" and final.output[1].arguments == arguments
