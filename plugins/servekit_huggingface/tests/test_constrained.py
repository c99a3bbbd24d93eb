"""Constrained decoding in the Hugging Face plugin's scheduler, in-process: a constrained row and a
free row in one step (the free row's tokens are those it makes alone), the grammar compiled once per
schema, JSON that strict parsers read, and the UTF-8 rules the JSON rows keep."""

from __future__ import annotations

import json

import jsonschema
import pytest
from generative_models import build_tiny_gpt2, load_causal
from lazy_modules import lazy_module
from servekit.errors import BadRequest
from servekit.types import Constraint, GenerationRequest

# needs torch: out of the quick lane
pytestmark = pytest.mark.slow
# looked up at collection, imported by the first test that loads a model
lazy_module("torch")
lazy_module("xgrammar")  # the structured-outputs extra

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "n": {"type": "integer", "minimum": -5, "maximum": 500},
        "on": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 4},
    },
    "required": ["name", "n", "on", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    loaded = load_causal(build_tiny_gpt2(tmp_path_factory.mktemp("constrained") / "gpt", n_positions=1024))
    yield loaded
    loaded.close()


def run(model, seqs) -> None:
    """Submit the sequences at once (they join one step), then read each to its end."""
    with model.scheduler.lock:  # the scheduler's thread waits: every sequence is queued before its step
        for seq in seqs:
            model.scheduler.submit(seq)
    for seq in seqs:
        for _ in seq.tokens_as_produced(model.scheduler.alive):
            pass


def test_a_constrained_row_and_a_free_row_share_steps_and_the_free_row_is_unchanged(model):
    free = GenerationRequest(prompt="hello world", max_tokens=40, temperature=0, options={"ignore_eos": True})
    alone, _ = model._sequence(free)
    run(model, [alone])
    constraint = Constraint("json_schema", SCHEMA, "response_format")
    together, _ = model._sequence(free)
    constrained, _ = model._sequence(GenerationRequest(prompt="hi", max_tokens=300, seed=4, constraint=constraint))
    run(model, [together, constrained])
    assert model.scheduler.most_rows >= 2  # they decoded in one batch
    assert together.tokens == alone.tokens
    text = model.tokenizer.decode(constrained.tokens, skip_special_tokens=True)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert constrained.finish_reason == "stop"


def test_a_schema_is_compiled_once_and_every_output_is_strict_json(model):
    schema = {**SCHEMA, "title": "compiled once"}  # a schema of this test's own
    before = model.grammars("response_format").compiles
    constraint = Constraint("json_schema", schema, "guided_json")
    results = [
        model.complete(GenerationRequest(prompt="hi", max_tokens=300, temperature=1.5, seed=s, constraint=constraint))
        for s in range(30)
    ]
    assert model.grammars("response_format").compiles == before + 1
    for result in results:
        assert result.constrained and result.finish_reason == "stop"
        value = json.loads(result.text)  # strict: no raw control characters
        jsonschema.validate(value, schema)
        result.text.encode("utf-8")  # no lone surrogates
        assert "\ufffd" not in result.text


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        (Constraint("regex", "[a-d]{2}[0-9]", "guided_regex"), lambda t: len(t) == 3 and t[2].isdigit()),
        (Constraint("choice", ["a.b", "(x)"], "guided_choice"), lambda t: t in ("a.b", "(x)")),
        (Constraint("grammar", 'root ::= "on" | "off"', "guided_grammar"), lambda t: t in ("on", "off")),
        # any object: a random model's may outgrow max_tokens (then it is cut, "length"), else it is whole
        (Constraint("json_object", None, "response_format"), lambda t: t.startswith("{")),
    ],
)
def test_each_kind_of_constraint_holds(model, constraint, check):
    for seed in range(5):
        result = model.complete(
            GenerationRequest(prompt="x", max_tokens=200, temperature=1.0, seed=seed, constraint=constraint)
        )
        assert check(result.text), result.text
        if result.finish_reason == "stop" and constraint.kind == "json_object":
            assert isinstance(json.loads(result.text), dict)


@pytest.mark.parametrize(
    ("constraint", "fragment"),
    [
        (Constraint("json_schema", {"type": "nonsense"}, "guided_json"), "cannot be compiled"),
        (Constraint("regex", "(", "guided_regex"), "cannot be compiled"),
        (Constraint("grammar", "root ::= ", "guided_grammar"), "cannot be compiled"),
    ],
)
def test_what_cannot_compile_is_a_400_naming_the_field(model, constraint, fragment):
    with pytest.raises(BadRequest) as caught:
        model.complete(GenerationRequest(prompt="x", constraint=constraint))
    assert caught.value.param == constraint.param and fragment in str(caught.value)


def test_ignore_eos_with_a_constraint_is_refused(model):
    constraint = Constraint("json_object", None, "response_format")
    with pytest.raises(BadRequest) as caught:
        model.complete(GenerationRequest(prompt="x", constraint=constraint, options={"ignore_eos": True}))
    assert caught.value.param == "ignore_eos"


def test_the_utf8_rules():
    from servekit_huggingface.constrained import _incomplete_end, _utf8_prefix

    assert _utf8_prefix(b"", "é€😀".encode())
    assert _utf8_prefix(b"\xe2", b"\x82")  # a character left open for the next token
    assert not _utf8_prefix(b"\xed", b"\xba")  # a surrogate
    assert not _utf8_prefix(b"", b"\xc0\xaf")  # an overlong form
    assert not _utf8_prefix(b"", b"\x80")  # a continuation with nothing to continue
    assert not _utf8_prefix(b"\xf4", b"\x90")  # past U+10FFFF
    assert _incomplete_end(b"ab\xe2\x82") == b"\xe2\x82" and _incomplete_end("é".encode()) == b""
