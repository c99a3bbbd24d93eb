"""Structured outputs and tool calling through the clients people use, against a real ``servekit serve``.

``gpt`` is a tiny GPT-2 with random weights whose chat template is Hermes-shaped
(it lists the tools and writes ``<tool_call>`` blocks): whatever it would write
freely, under a JSON schema or a forced tool call every output validates, which only
constrained decoding can give.  ``generate-only`` is the same model with
``continuous_batching: false`` (no grammar there: a 400 naming the field), and
``tooly`` a model.py that answers with a Hermes tool call (``tool_choice: auto``).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import jsonschema
import pytest
from generative_models import HERMES_CHAT_TEMPLATE, TOOL_MODEL_PY, build_tiny_gpt2, write_model
from lazy_modules import lazy_module
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow  # starts a real server

# looked up at collection, imported by the first test that needs them (xgrammar imports torch)
openai = lazy_module("openai")
lazy_module("xgrammar")  # the structured-outputs extra, which the server imports


class Pet(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]


PET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("structured")
    build_tiny_gpt2(base / "gpt", n_positions=1024, chat_template=HERMES_CHAT_TEMPLATE)
    build_tiny_gpt2(base / "generate-only", n_positions=1024)
    (base / "generate-only" / "servekit.yaml").write_text("options: {continuous_batching: false}\n")
    write_model(base / "tooly", TOOL_MODEL_PY)
    with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _many(client, count: int, **body) -> list:
    """``count`` chat answers at temperature 1 with seeds 0..count-1, sent 16 at a time (they share steps)."""

    def one(seed: int):
        return client.chat.completions.create(
            model="gpt", messages=ASK, temperature=1.0, seed=seed, max_tokens=300, **body
        ).choices[0]

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(count)))


def test_a_hundred_of_a_hundred_random_outputs_validate_under_a_json_schema(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET_SCHEMA, "strict": True}}
    choices = _many(client, 100, response_format=response_format)
    for choice in choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PET_SCHEMA)
    assert len({c.message.content for c in choices}) > 50  # sampled, not one answer repeated


def test_a_hundred_of_a_hundred_required_and_named_tool_calls_validate(client):
    required = _many(client, 50, tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False)
    named = _many(
        client, 50, tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    for choice in required + named:
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert {c.finish_reason for c in required} == {"tool_calls"}
    assert {c.finish_reason for c in named} == {"stop"}  # OpenAI's answer to a named function
    assert {c.message.tool_calls[0].function.name for c in named} == {"get_time"}


def test_openai_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model="gpt", messages=ASK, response_format=Pet, temperature=1.0, seed=3, max_tokens=300
    )
    pet = completion.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.age <= 30


def test_openai_streams_a_named_call_s_arguments_as_tool_call_deltas(client):
    stream = client.chat.completions.create(
        model="gpt",
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
        seed=5,
        max_tokens=300,
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    calls = [tc for d in deltas if d.tool_calls for tc in d.tool_calls]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert len(calls) > 2  # the arguments come piece by piece
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_openai_streams_an_auto_call_the_model_wrote(client):
    stream = client.chat.completions.create(model="tooly", messages=ASK, tools=[WEATHER], stream=True)
    chunks = [c for c in stream if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks if c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert content == "Let me look." and len(calls) == 1
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_choice": ["north", "south"]}, lambda text: text in ("north", "south")),
        ({"guided_regex": "[a-c]{3}-[0-9]{2}"}, lambda text: len(text) == 6 and text[3] == "-"),
        (
            {"structured_outputs": {"json": PET_SCHEMA}},
            lambda text: jsonschema.validate(json.loads(text), PET_SCHEMA) is None,
        ),
        ({"response_format": {"type": "json_object"}}, lambda text: isinstance(json.loads(text), dict)),
        ({"guided_grammar": 'root ::= "yes" | "no" " " [0-9]'}, lambda text: text == "yes" or text[:3] == "no "),
    ],
)
def test_completions_take_vllm_s_structured_output_fields(client, extra, check):
    result = client.completions.create(
        model="gpt", prompt="pick:", max_tokens=300, temperature=1.0, seed=11, extra_body=extra
    )
    assert result.choices[0].finish_reason == "stop" and check(result.choices[0].text)


def test_a_schema_the_engine_cannot_compile_answers_400_naming_it(server):
    body = {"model": "gpt", "messages": ASK, "guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"
    assert "strin" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_without_continuous_batching_refuses_a_schema_instead_of_answering_free_text(server, stream):
    response_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET_SCHEMA}}
    body = {"model": "generate-only", "messages": ASK, "response_format": response_format, "stream": stream}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_langchain_structured_output_and_a_two_turn_tool_loop(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    llm = langchain_openai.ChatOpenAI(
        model="gpt", base_url=server.url + "/v1", api_key="unused", temperature=1.0, max_tokens=300, max_retries=0
    )
    pet = llm.with_structured_output(Pet).invoke("a pet, please")
    assert isinstance(pet, Pet)

    class City(BaseModel):
        city: str = Field(max_length=12)  # bounded: a random model's string ends within max_tokens

    @tool(args_schema=City)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    messages = [HumanMessage("what is the weather?")]
    first = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = llm.bind_tools([get_weather]).invoke(messages)  # auto: the Hermes template's format
    assert isinstance(second.content, str)


def test_instructor_fills_a_pydantic_model_through_a_forced_tool_call(server):
    instructor = pytest.importorskip("instructor")
    client = instructor.from_openai(
        openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0), mode=instructor.Mode.TOOLS
    )
    pet = client.chat.completions.create(
        model="gpt", response_model=Pet, messages=ASK, max_retries=0, temperature=1.0, max_tokens=300
    )
    assert isinstance(pet, Pet)


def test_litellm_tool_calls(server):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: litellm's own cost table
    litellm = pytest.importorskip("litellm")
    response = litellm.completion(
        model="openai/gpt",
        api_base=server.url + "/v1",
        api_key="unused",
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: a random model's list of calls could run past max_tokens
        seed=1,
        max_tokens=300,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time")
    json.loads(call.function.arguments)
