"""Tool calling: what the model is asked to call, and the calls read back from its text.

The protocol reads OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
into a :class:`ToolUse`; the chat template presents the tools
(``apply_chat_template(tools=...)``, :func:`.generation.format_chat`), and the
generated text becomes ``message.tool_calls``:

- ``tool_choice: "auto"``: the model writes free text; a parser for its family
  finds the calls in it: ``hermes`` (Hermes, Qwen: ``<tool_call>{"name", "arguments"}</tool_call>``),
  ``llama3`` (a JSON object ``{"name", "parameters"}``, after ``<|python_tag|>`` or alone)
  and ``mistral`` (``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``, or
  ``name[ARGS]{...}``).  The parser is detected from the chat template
  (:func:`detect_parser`), or named by the model's ``options.tool_call_parser``.
- ``"required"`` and a named function: the text is decoded under a grammar
  (:meth:`ToolUse.constraint`): for a named function its parameters' schema (the
  text is the arguments), for ``required`` a JSON list of ``{"name", "arguments"}``
  each under its tool's schema, so the arguments always validate.

A stream's text goes through :class:`ToolCallStream`, which sends the text before a
call as content and the calls as OpenAI's ``delta.tool_calls`` (index, id, name,
then the arguments).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from servekit.types import Constraint

#: the parsers :func:`parse_calls` knows, by model family
PARSERS = ("hermes", "llama3", "mistral")
#: what starts a call in each family's text (``llama3``: a JSON object at the start)
_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": "<|python_tag|>"}


@dataclass
class ToolCall:
    """One call as OpenAI answers it: ``arguments`` is JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function"}
        if index is not None:
            out = {"index": index, **out}
        out["function"] = {"name": self.name, "arguments": self.arguments}
        return out


def detect_parser(chat_template: Any) -> str | None:
    """The tool-call format a chat template teaches its model, ``None`` when it shows none."""
    if isinstance(chat_template, dict):  # several named templates
        chat_template = "\n".join(str(t) for t in chat_template.values())
    if not isinstance(chat_template, str):
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3"
    return None


@dataclass
class ToolUse:
    """A chat request's tools and how the model may call them."""

    tools: list[dict[str, Any]]
    #: ``"auto"``, ``"required"`` or ``"named"`` (``"none"`` is no ToolUse at all)
    choice: str
    #: the function ``tool_choice`` names (``choice == "named"``)
    named: str | None = None
    parallel: bool = True
    #: the family's parser (``choice == "auto"``)
    parser: str | None = None

    def parameters(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters") or {"type": "object", "properties": {}}
        raise KeyError(name)

    def constraint(self) -> Constraint | None:
        """The grammar a forced call is decoded under (``None`` for ``auto``)."""
        if self.choice == "named":
            assert self.named is not None
            return Constraint("json_schema", self.parameters(self.named), "tool_choice")
        if self.choice == "required":
            one_call = {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"name": {"enum": [name]}, "arguments": self.parameters(name)},
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    }
                    for name in (tool["function"]["name"] for tool in self.tools)
                ]
            }
            calls: dict[str, Any] = {"type": "array", "items": one_call, "minItems": 1}
            if not self.parallel:
                calls["maxItems"] = 1
            return Constraint("json_schema", calls, "tool_choice")
        return None

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The content and the calls in a whole generated text (no calls: the text is the content)."""
        if self.choice == "named":
            assert self.named is not None
            return None, [ToolCall(self.named, text.strip())]
        if self.choice == "required":
            calls = _calls_from_list(_loads(text))
            return (None, calls) if calls else (text, [])
        content, calls = parse_calls(self.parser or "", text)
        if calls and not self.parallel:
            calls = calls[:1]
        return content, calls

    def finish_reason(self, given: str, calls: list[ToolCall]) -> str:
        """OpenAI's: ``tool_calls`` when the model chose to call (``auto``, ``required``); a named
        function's forced call keeps the text's own reason (``stop``), as OpenAI answers it."""
        if calls and self.choice != "named" and given == "stop":
            return "tool_calls"
        return given


# -- parsing --------------------------------------------------------------------------


def parse_calls(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """Content and calls in ``text`` by one family's format; text that holds no well-formed call
    is all content (as vLLM's parsers answer it)."""
    if parser == "hermes":
        start = text.find("<tool_call>")
        if start < 0:
            return text, []
        bodies = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text[start:], flags=re.S)
        calls = _calls_from_list([_loads(b) for b in bodies])
        return (_content(text[:start]), calls) if calls else (text, [])
    if parser == "mistral":
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return text, []
        rest = text[start + len("[TOOL_CALLS]") :].strip()
        if "[ARGS]" in rest:  # the newer form: name[ARGS]{...}, one after another
            pieces = re.findall(
                r"([A-Za-z0-9_\-.]+)\[ARGS\](\{.*?\})(?=\s*(?:\[TOOL_CALLS\]|[A-Za-z0-9_\-.]+\[ARGS\]|$))",
                rest,
                flags=re.S,
            )
            calls = _calls_from_list([{"name": n, "arguments": _loads(a)} for n, a in pieces])
        else:
            calls = _calls_from_list(_loads(rest))
        return (_content(text[:start]), calls) if calls else (text, [])
    if parser == "llama3":
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].strip()
        if not body.startswith("{"):
            return text, []
        calls = _calls_from_list([_loads(part) for part in _split_objects(body)])
        return (None, calls) if calls else (text, [])
    return text, []


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _calls_from_list(value: Any) -> list[ToolCall]:
    """Calls from ``{"name", "arguments" | "parameters"}`` objects; nothing unless every one is well formed."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            arguments = _loads(arguments)
        if not isinstance(arguments, dict):
            return []
        calls.append(ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


def _split_objects(body: str) -> list[str]:
    """Llama 3's calls: one JSON object, or several joined by ``;``."""
    decoder = json.JSONDecoder()
    parts, at = [], 0
    while at < len(body):
        try:
            _, end = decoder.raw_decode(body, at)
        except ValueError:
            return [body]
        parts.append(body[at:end])
        at = end
        while at < len(body) and body[at] in " \n\t;":
            at += 1
    return parts


def _content(text: str) -> str | None:
    return text.strip() or None


# -- streaming ------------------------------------------------------------------------


@dataclass
class Delta:
    """What a stream sends for a piece: content text, and/or calls' deltas (OpenAI's shape)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ToolCallStream:
    """A choice's text as it streams, turned into content and ``delta.tool_calls``.

    A named function's arguments stream as they come (its name goes first);
    ``required`` and ``auto`` calls are sent once their text is complete, each as
    one delta with its index, id, name and arguments.  With ``auto``, text that
    may still turn into a call (a marker's first characters) is held back until
    the next piece decides it.
    """

    def __init__(self, use: ToolUse):
        self.use = use
        self.held = ""  # text not sent yet
        self.holding = False  # a call started: everything from here on is the call's
        self.calls: list[ToolCall] = []
        self.named: ToolCall | None = None

    def feed(self, text: str) -> Delta:
        use = self.use
        if use.choice == "named":
            assert use.named is not None
            deltas = []
            if self.named is None:
                self.named = ToolCall(use.named, "")
                self.calls.append(self.named)
                deltas.append({**self.named.as_openai(0)})
            self.named.arguments += text
            if text:
                deltas.append({"index": 0, "function": {"arguments": text}})
            return Delta(tool_calls=deltas)
        self.held += text
        if use.choice == "required" or self.holding:
            return Delta()
        marker = _MARKERS.get(use.parser or "")
        start = self.held.find(marker) if marker else -1
        if use.parser == "llama3" and self.held.lstrip().startswith("{"):
            start = 0
        if start >= 0:
            out, self.held, self.holding = self.held[:start], self.held[start:], True
            return Delta(content=out)
        keep = _partial_marker(self.held, marker or "")
        if use.parser == "llama3" and not self.held.strip():
            keep = len(self.held)  # only whitespace so far: a call may still start
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return Delta(content=out)

    def finish(self) -> Delta:
        """What is left once the text ended: the held text as content, or the calls found in it."""
        if self.use.choice == "named":
            if self.named is None:  # an empty text: the call still goes out
                return self.feed("")
            return Delta()
        held, self.held = self.held, ""
        if self.use.choice == "required":
            content, calls = self.use.parse(held)
        elif self.holding:
            content, calls = parse_calls(self.use.parser or "", held)
            if calls and not self.use.parallel:
                calls = calls[:1]
        else:
            content, calls = held, []
        self.calls = calls
        return Delta(content=content or "", tool_calls=[call.as_openai(i) for i, call in enumerate(calls)])


def _partial_marker(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that starts ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
