"""OpenAI's Responses API, stateless: ``POST /v1/responses`` (and under ``/openai/v1`` and no prefix).

The route is :mod:`.openai`'s; this module reads the request and writes the answer.
A request is translated into a chat completion (``openai.chat_job``), so it
runs through the same data plane, stop sequences, usage and metrics, and its
answer (or its stream) is written as a Response object (or its events):

- ``input`` (a string, or a list of messages and input items: ``input_text`` and
  ``output_text`` parts, ``function_call`` and ``function_call_output`` items) and
  ``instructions`` (a system message first) become chat's ``messages``;
- ``max_output_tokens``, ``temperature``, ``top_p``, ``top_logprobs``, ``user``,
  ``stream`` are chat's; ``tools`` (function tools), ``tool_choice``,
  ``parallel_tool_calls`` and ``text.format`` (chat's ``response_format``) are
  handed to chat, which answers them or refuses them with a 400, passed on here;
- ``metadata`` is answered back as sent.

Nothing is stored: ``store: true``, ``previous_response_id``, ``conversation``,
``background`` and every other field that needs state or a hosted tool are
refused with a 400 naming them (:data:`REFUSED`).  A stream sends
``response.created``, ``response.in_progress``, the message's
``response.output_item.added`` and ``response.content_part.added``, one
``response.output_text.delta`` per piece, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut
the text), each with its ``sequence_number``.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

from servekit.dataplane import generation as gen
from servekit.dataplane.tool_calls import ToolCallStream, ToolUse
from servekit.errors import BadRequest
from servekit.protocols import openai_fields as fields
from servekit.protocols.streaming import event
from servekit.streams import close

log = logging.getLogger("servekit.openai")

#: the fields read (``text`` and ``stream_options`` at their supported values, see :func:`chat_body`)
HONOURED = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_logprobs", "stream",
        "stream_options", "user", "metadata", "text", "tools", "tool_choice", "parallel_tool_calls",
    }
)  # fmt: skip

#: fields refused unless at a value that changes nothing: nothing is stored, nothing runs in the background
REFUSED: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "store": (None, False),
    "background": (None, False),
    "background_options": (None,),
    "include": (None, []),
    "prompt": (None,),
    "reasoning": (None,),
    "truncation": (None, "disabled"),
    "max_tool_calls": (None,),
    "service_tier": (None, "auto", "default"),
    "context_management": (None,),
    "prompt_cache_key": (None,),
    "prompt_cache_options": (None,),
    "prompt_cache_retention": (None,),
    "safety_identifier": (None,),
    "moderation": (None,),
    "image": (None,),
    "access_programs": (None,),
}

#: chat's names in a refusal, as the client sent them here
RENAMED = {
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text",
    "logprobs": "top_logprobs",
    "verbosity": "text",
}

MESSAGE_ROLES = ("user", "system", "developer", "assistant")


# -- the request, as a chat ----------------------------------------------------------------


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a Responses request asks for (fields checked, names translated)."""
    fields.check_fields(body, HONOURED, REFUSED)
    chat: dict[str, Any] = {"messages": input_messages(body)}
    for key in ("model", "temperature", "top_p", "user", "tools", "tool_choice", "parallel_tool_calls", "stream"):
        if key in body:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs") is not None:
        chat["logprobs"] = True
        chat["top_logprobs"] = body["top_logprobs"]
    if body.get("tools") is not None:
        chat["tools"] = chat_tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        chat["tool_choice"] = chat_tool_choice(body["tool_choice"])
    chat.update(text_options(body.get("text")))
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or any(k != "include_obfuscation" for k in options):
            raise BadRequest("'stream_options' may hold only 'include_obfuscation'", param="stream_options")
        if options.get("include_obfuscation") not in (None, False):  # no obfuscation padding is sent
            raise BadRequest(
                "'stream_options.include_obfuscation': true is not supported by this server", param="stream_options"
            )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object of strings", param="metadata")
    return chat


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'input' must be a string or a non-empty list of input items", param="input")
    for i, item in enumerate(raw):
        messages.append(_input_item(item, f"input[{i}]"))
    return messages


def _input_item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise BadRequest(f"{where} must be an object (a message or an input item)", param="input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}, found {role!r}", param="input")
        return {"role": role, "content": _content(item.get("content"), where)}
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function"}
        call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
    raise BadRequest(
        f"{where}: input items of type {kind!r} are not supported (messages, function_call and "
        "function_call_output are)",
        param="input",
    )


def _content(content: Any, where: str) -> str:
    """A message's content as text: a string, or ``input_text`` / ``output_text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content parts", param="input")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise BadRequest(
                f"{where}.content: only text parts (input_text, output_text) are supported, found {kind!r}",
                param="input",
            )
        texts.append(part["text"])
    return "".join(texts)


def chat_tools(tools: Any) -> Any:
    """Function tools in chat's shape (``{"type": "function", "function": {...}}``); others are refused."""
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tools", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequest(f"tools[{i}]: only function tools are supported, found {kind!r}", param="tools")
        function = {k: v for k, v in tool.items() if k != "type"}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any]) -> Any:
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("type") == "allowed_tools" or "mode" in choice:
        raise BadRequest("'tool_choice' with allowed_tools is not supported", param="tool_choice")
    raise BadRequest(f"'tool_choice' of type {choice.get('type')!r} is not supported", param="tool_choice")


def text_options(text: Any) -> dict[str, Any]:
    """``text.format`` as chat's ``response_format`` (and ``text.verbosity`` as chat's ``verbosity``)."""
    if text is None:
        return {}
    if not isinstance(text, dict):
        raise BadRequest("'text' must be an object", param="text")
    out: dict[str, Any] = {}
    for key in text:
        if key not in ("format", "verbosity"):
            raise BadRequest(f"Unrecognized request argument supplied: text.{key}", param="text")
    if text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    form = text.get("format")
    if form is None or (isinstance(form, dict) and form.get("type") == "text"):
        return out
    if not isinstance(form, dict):
        raise BadRequest("'text.format' must be an object", param="text")
    if form.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif form.get("type") == "json_schema":
        schema = {k: v for k, v in form.items() if k != "type"}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise BadRequest(f"'text.format.type' must be text, json_object or json_schema, found {form.get('type')!r}",
                         param="text")  # fmt: skip
    return out


@contextmanager
def renamed() -> Iterator[None]:
    """A refusal of the chat the request became, in this request's names."""
    try:
        yield
    except BadRequest as exc:
        param = getattr(exc, "param", None)
        if param not in RENAMED:
            raise
        message = exc.message.replace(f"'{param}'", f"'{RENAMED[param]}'")
        raise BadRequest(message, param=RENAMED[param]) from None


# -- the answer -------------------------------------------------------------------------------


#: a chunk's log-probabilities as chat's ``logprobs`` object (``None`` when none were asked), from
#: the entries and where their text starts
RenderLogprobs = Callable[[list[gen.TokenLogprob] | None, int], dict[str, Any] | None]


class Answer:
    """One Responses request: its ids and the parts of the Response object that echo the request."""

    def __init__(self, body: dict[str, Any], model: str):
        self.body, self.model = body, model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        text_format = (body.get("text") or {}).get("format") or {"type": "text"}
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": None,
            "service_tier": "default",
            "store": False,
            "temperature": body.get("temperature"),
            "text": {"format": text_format},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs"),
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "usage": usage,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    def message(self, text: str, status: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [] if status == "in_progress" else [output_text(text, logprobs)],
        }


def output_text(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def usage_object(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def whole(answer: Answer, completion: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as a Response: a reasoning item, the message, and a ``function_call`` per tool call."""
    choice = completion["choices"][0]
    message = choice["message"]
    status = _status(choice["finish_reason"])
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
                "status": status,
            }
        )
    logprobs = (choice.get("logprobs") or {}).get("content")
    if message.get("content") or not message.get("tool_calls"):
        output.append(answer.message(message.get("content") or "", status, logprobs))
    for call in message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.get("id"),
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = completion["usage"]
    return answer.response(status, output, usage_object(usage["prompt_tokens"], usage["completion_tokens"]))


# -- streaming --------------------------------------------------------------------------------


class Events:
    """The Responses stream's events, numbered: a reasoning item while reasoning arrives (opened at its
    first piece), then the message (opened at the first text, or at the end)."""

    def __init__(self, answer: Answer, render_logprobs: RenderLogprobs, predictions: Any, tools: ToolUse | None = None):
        self.answer = answer
        #: the model's text read for tool calls (chat's parser), when it may call tools
        self.tool_stream = ToolCallStream(tools) if tools is not None else None
        self.call: dict[str, Any] | None = None  # the function call item being streamed
        self.render_logprobs = render_logprobs
        self.predictions = predictions  # each finished choice is handed to the request log
        self.numbers = itertools.count()
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.reasoning: list[str] | None = None  # while a reasoning item is open
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.message_open = False
        self.status = "in_progress"
        self.output: list[dict[str, Any]] = []

    def send(self, kind: str, **fields: Any) -> bytes:
        return event({"type": kind, "sequence_number": next(self.numbers), **fields}, name=kind)

    def part(self, item_id: str, **fields: Any) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": len(self.output), "content_index": 0, **fields}

    def render(self, item: gen.StreamEvent) -> Iterator[bytes]:
        if isinstance(item, gen.StreamPiece):
            chunk = item.chunk
            if chunk.reasoning:
                yield from self.open_reasoning()
                assert self.reasoning is not None
                self.reasoning.append(chunk.reasoning)
                yield self.send("response.reasoning_text.delta", **self.part(self.reasoning_id, delta=chunk.reasoning))
            logprobs = self.render_logprobs(chunk.logprobs, item.offset)
            entries = (logprobs or {}).get("content") or []
            calls: list[dict[str, Any]] = []
            text = chunk.text
            if self.tool_stream is not None:
                found = self.tool_stream.feed(chunk.text)
                text, calls = found.content, found.tool_calls
            if text or entries:
                yield from self.open_message()
                self.text.append(text)
                self.logprobs.extend(entries)
                delta = self.part(self.answer.message_id, delta=text, logprobs=entries)
                yield self.send("response.output_text.delta", **delta)
            yield from self.tool_calls(calls)
        elif isinstance(item, gen.ChoiceEnded):
            choice = item.choice.finished
            self.predictions.add({"index": 0, "text": choice.text, "finish_reason": choice.finish_reason})
            self.status = _status(choice.finish_reason)
            if self.tool_stream is not None:
                rest = self.tool_stream.finish()
                if rest.content:
                    yield from self.open_message()
                    self.text.append(rest.content)
                    delta = self.part(self.answer.message_id, delta=rest.content, logprobs=[])
                    yield self.send("response.output_text.delta", **delta)
                yield from self.tool_calls(rest.tool_calls)
                yield from self.close_call()
            if self.message_open or not any(item["type"] == "function_call" for item in self.output):
                yield from self.open_message()
                yield from self.close_message()
        elif isinstance(item, gen.StreamEnded):
            usage = usage_object(item.usage.prompt_tokens, item.usage.completion_tokens)
            kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
            yield self.send(kind, response=self.answer.response(self.status, self.output, usage))

    def open_reasoning(self) -> Iterator[bytes]:
        if self.reasoning is not None:
            return
        self.reasoning = []
        item = {"type": "reasoning", "id": self.reasoning_id, "summary": [], "content": [], "status": "in_progress"}
        yield self.send("response.output_item.added", output_index=len(self.output), item=item)
        part = {"type": "reasoning_text", "text": ""}
        yield self.send("response.content_part.added", **self.part(self.reasoning_id, part=part))

    def close_reasoning(self) -> Iterator[bytes]:
        if self.reasoning is None:
            return
        text, self.reasoning = "".join(self.reasoning), None
        yield self.send("response.reasoning_text.done", **self.part(self.reasoning_id, text=text))
        part = {"type": "reasoning_text", "text": text}
        yield self.send("response.content_part.done", **self.part(self.reasoning_id, part=part))
        item = {"type": "reasoning", "id": self.reasoning_id, "summary": [], "content": [part], "status": "completed"}
        yield self.send("response.output_item.done", output_index=len(self.output), item=item)
        self.output.append(item)

    def open_message(self) -> Iterator[bytes]:
        if self.message_open:
            return
        yield from self.close_reasoning()
        self.message_open = True
        item = self.answer.message("", "in_progress", None)
        yield self.send("response.output_item.added", output_index=len(self.output), item=item)
        part = output_text("", None)
        yield self.send("response.content_part.added", **self.part(self.answer.message_id, part=part))

    def tool_calls(self, deltas: list[dict[str, Any]]) -> Iterator[bytes]:
        """Chat's ``tool_calls`` deltas as function call items: each opened when its call starts (the
        message before it closed), its arguments streamed, closed when the next starts or the text ends."""
        for delta in deltas:
            function = delta.get("function") or {}
            if "id" in delta:  # a call starts
                if self.message_open:
                    yield from self.close_message("completed")
                    self.answer.message_id = f"msg_{uuid.uuid4().hex}"  # text after the call: a new message
                yield from self.close_call()
                self.call = {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex}",
                    "call_id": delta["id"],
                    "name": function.get("name"),
                    "arguments": "",
                    "status": "in_progress",
                }
                yield self.send("response.output_item.added", output_index=len(self.output), item=dict(self.call))
            arguments = function.get("arguments") or ""
            if arguments and self.call is not None:
                self.call["arguments"] += arguments
                where = {"item_id": self.call["id"], "output_index": len(self.output)}
                yield self.send("response.function_call_arguments.delta", **where, delta=arguments)

    def close_call(self) -> Iterator[bytes]:
        if self.call is None:
            return
        call, self.call = self.call, None
        call["status"] = "completed"
        where = {"item_id": call["id"], "output_index": len(self.output)}
        yield self.send(
            "response.function_call_arguments.done", **where, name=call["name"], arguments=call["arguments"]
        )
        yield self.send("response.output_item.done", output_index=len(self.output), item=call)
        self.output.append(call)

    def close_message(self, status: str | None = None) -> Iterator[bytes]:
        text, message_id = "".join(self.text), self.answer.message_id
        yield self.send("response.output_text.done", **self.part(message_id, text=text, logprobs=self.logprobs))
        part = output_text(text, self.logprobs)
        yield self.send("response.content_part.done", **self.part(message_id, part=part))
        done = self.answer.message(text, status or self.status, self.logprobs)
        yield self.send("response.output_item.done", output_index=len(self.output), item=done)
        self.output.append(done)
        self.message_open, self.text, self.logprobs = False, [], []


def stream_events(
    stream: Events,
    head: list[gen.StreamEvent],
    events: Generator[gen.StreamEvent, None, None],
    error_body: Callable[[BaseException], dict[str, Any]],
) -> Iterator[bytes]:
    """The whole stream: the response's creation, its items' events, its end (an error in-band)."""
    answer = stream.answer
    yield stream.send("response.created", response=answer.response("in_progress", [], None))
    yield stream.send("response.in_progress", response=answer.response("in_progress", [], None))
    try:
        for item in itertools.chain(head, events):
            yield from stream.render(item)
    except GeneratorExit:
        raise  # the client is gone; finally stops the model
    except Exception as exc:  # the 200 is sent: report in-band, as OpenAI's error event
        log.warning("responses stream failed: %s", exc)
        error = error_body(exc)["error"]
        yield stream.send("error", code=str(error.get("code")), message=error.get("message"), param=error.get("param"))
        failed = answer.response("failed", stream.output, None)
        failed["error"] = {"code": "server_error", "message": error.get("message")}
        yield stream.send("response.failed", response=failed)
    finally:
        close(events)
    yield stream.predictions.trailer()
