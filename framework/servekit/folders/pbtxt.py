"""Protocol buffer text format (Triton's ``config.pbtxt``) as plain dicts, without a schema.

servekit reads a few fields of a Triton model configuration (an output's
``label_filename``, an ensemble's ``ensemble_scheduling``) and must not need
the protobuf runtime (the ``grpc`` extra) for it.  Without the schema, a field
given once is a value and a field given more than once (or as ``[...]``) is a
list; :func:`repeated` reads a field either way.  Scalars come back as
``str`` (quoted strings and enum names alike), ``int``, ``float`` or ``bool``.
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r"""\s+|\#[^\n]*|(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<punct>[{}\[\]:,;<>])|(?P<word>[^\s{}\[\]:,;<>"'#]+)""",
    re.S,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}


class ParseError(ValueError):
    pass


def loads(text: str) -> dict[str, Any]:
    """A text-format message as a dict."""
    tokens = _tokens(text)
    doc, pos = _message(tokens, 0, None)
    return doc


def repeated(doc: dict[str, Any], key: str) -> list[Any]:
    """A field as a list, whether it was given once or several times."""
    value = doc.get(key)
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ParseError(f"unexpected character {text[pos]!r} at offset {pos}")
        pos = match.end()
        if match.group("string") is not None:
            out.append(("value", _unquote(match.group("string"))))
        elif match.group("punct") is not None:
            out.append(("punct", match.group("punct")))
        elif match.group("word") is not None:
            out.append(("word", match.group("word")))
    return out


def _unquote(quoted: str) -> str:
    body = quoted[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _scalar(word: str) -> Any:
    if word in ("true", "True"):
        return True
    if word in ("false", "False"):
        return False
    try:
        return int(word, 0)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        return word


def _message(tokens: list[tuple[str, Any]], pos: int, close: str | None) -> tuple[dict[str, Any], int]:
    doc: dict[str, Any] = {}
    while pos < len(tokens):
        kind, value = tokens[pos]
        if kind == "punct" and value in (",", ";"):
            pos += 1
            continue
        if kind == "punct" and value == close:
            return doc, pos + 1
        if kind != "word":
            raise ParseError(f"expected a field name, found {value!r}")
        key = value
        pos += 1
        if pos < len(tokens) and tokens[pos] == ("punct", ":"):
            pos += 1
        item, pos = _value(tokens, pos)
        if key in doc:
            old = doc[key]
            items = item if isinstance(item, list) else [item]
            doc[key] = (old if isinstance(old, list) else [old]) + items
        else:
            doc[key] = item
    if close is not None:
        raise ParseError(f"a message is not closed with {close!r}")
    return doc, pos


def _value(tokens: list[tuple[str, Any]], pos: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise ParseError("a field has no value")
    kind, value = tokens[pos]
    if kind == "punct" and value in ("{", "<"):
        return _message(tokens, pos + 1, "}" if value == "{" else ">")
    if kind == "punct" and value == "[":
        items: list[Any] = []
        pos += 1
        while pos < len(tokens) and tokens[pos] != ("punct", "]"):
            if tokens[pos] == ("punct", ","):
                pos += 1
                continue
            item, pos = _value(tokens, pos)
            items.append(item)
        if pos >= len(tokens):
            raise ParseError("a list is not closed with ']'")
        return items, pos + 1
    if kind == "value":
        # adjacent strings concatenate, as in C
        text = value
        pos += 1
        while pos < len(tokens) and tokens[pos][0] == "value":
            text += tokens[pos][1]
            pos += 1
        return text, pos
    if kind == "word":
        return _scalar(value), pos + 1
    raise ParseError(f"unexpected {value!r}")
