"""Tool calls read from generated text, whole and streamed (servekit.dataplane.tool_calls)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from servekit.dataplane.tool_calls import ToolCallStream, ToolUse, detect_parser, parse_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        ("{% for t in tools %}<tool_call>{{ t | tojson }}</tool_call>{% endfor %}", "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' }}...{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{% if tools %}<|start_header_id|>ipython<|end_header_id|>{% endif %}", "llama3"),
        ({"default": "plain", "tool_use": "<tool_call>"}, "hermes"),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", None),
        (None, None),
    ],
)
def test_the_parser_is_detected_from_the_chat_template(template, parser):
    assert detect_parser(template) == parser


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        (
            "hermes",
            'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            "Sure.",
            [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ),
        ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}', None, [("get_time", {})]),  # unclosed at the end
        (
            "llama3",
            '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            None,
            [("get_weather", {"city": "Oslo"})],
        ),
        (
            "llama3",
            '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_time", "parameters": {}}',
            None,
            [("get_time", {}), ("get_time", {})],
        ),
        (
            "mistral",
            'ok [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}]',
            "ok",
            [("get_weather", {"city": "Rome"})],
        ),
        (
            "mistral",
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{}',
            None,
            [("get_weather", {"city": "Rome"}), ("get_time", {})],
        ),
    ],
)
def test_each_family_s_calls_are_read_with_the_text_before_them(parser, text, content, calls):
    found_content, found = parse_calls(parser, text)
    assert found_content == content
    assert [(c.name, json.loads(c.arguments)) for c in found] == calls
    assert all(c.id.startswith("call_") for c in found) and len({c.id for c in found}) == len(found)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", "no call here"),
        ("hermes", "<tool_call>{not json}</tool_call>"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
        ("llama3", "{ broken"),
        ("mistral", "[TOOL_CALLS] nonsense"),
    ],
)
def test_text_without_a_well_formed_call_is_all_content(parser, text):
    assert parse_calls(parser, text) == (text, [])


def test_a_required_choice_s_grammar_is_a_list_of_calls_each_under_its_tool_s_schema():
    use = ToolUse([WEATHER, TIME], "required", parallel=False)
    constraint = use.constraint()
    assert constraint is not None and constraint.param == "tool_choice"
    good = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    jsonschema.validate(good, constraint.value)
    for bad in ([], good * 2, [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, constraint.value)
    content, calls = use.parse(json.dumps(good))
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert use.finish_reason("stop", calls) == "tool_calls"


def test_a_named_choice_s_text_is_the_arguments_and_keeps_its_finish_reason():
    use = ToolUse([WEATHER, TIME], "named", named="get_weather")
    constraint = use.constraint()
    assert constraint is not None and constraint.value == WEATHER["function"]["parameters"]
    content, calls = use.parse('{"city": "Lima"}')
    assert content is None and calls[0].name == "get_weather" and calls[0].arguments == '{"city": "Lima"}'
    assert use.finish_reason("stop", calls) == "stop"  # OpenAI's answer to a forced function
    assert ToolUse([TIME], "named", named="get_time").constraint().value == {"type": "object", "properties": {}}


def _streamed(use: ToolUse, text: str, size: int) -> tuple[str, list[dict]]:
    stream = ToolCallStream(use)
    content, deltas = "", []
    for i in range(0, len(text), size):
        delta = stream.feed(text[i : i + size])
        content += delta.content
        deltas += delta.tool_calls
    end = stream.finish()
    return content + end.content, deltas + end.tool_calls


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_a_streamed_hermes_call_never_leaks_its_marker_into_the_content(size):
    use = ToolUse([WEATHER], "auto", parser="hermes")
    text = 'Let me <look>.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    content, deltas = _streamed(use, text, size)
    assert content == "Let me <look>."
    assert len(deltas) == 1 and deltas[0]["index"] == 0 and deltas[0]["id"].startswith("call_")
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


@pytest.mark.parametrize("size", [1, 3])
def test_streamed_text_that_only_looks_like_a_marker_goes_out_as_content(size):
    content, deltas = _streamed(ToolUse([WEATHER], "auto", parser="hermes"), "a <tool_ca b", size)
    assert (content, deltas) == ("a <tool_ca b", [])
    content, deltas = _streamed(ToolUse([WEATHER], "auto", parser="llama3"), "  plain words", size)
    assert (content, deltas) == ("  plain words", [])


def test_a_named_call_streams_its_name_first_then_its_arguments_as_they_come():
    stream = ToolCallStream(ToolUse([WEATHER], "named", named="get_weather"))
    first = stream.feed('{"ci')
    assert first.content == "" and first.tool_calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert first.tool_calls[1] == {"index": 0, "function": {"arguments": '{"ci'}}
    assert stream.feed('ty": "X"}').tool_calls == [{"index": 0, "function": {"arguments": 'ty": "X"}'}}]
    assert stream.finish().tool_calls == [] and stream.calls[0].arguments == '{"city": "X"}'


def test_parallel_tool_calls_false_keeps_the_first_call_of_auto():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    _, calls = ToolUse([TIME], "auto", parser="hermes", parallel=False).parse(text)
    assert len(calls) == 1
