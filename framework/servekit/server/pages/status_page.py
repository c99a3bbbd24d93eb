"""``GET /``: KServe V1's liveness for programs, a small status page for browsers.

KServe's V1 protocol probes ``GET /`` for ``{"status": "alive"}`` (its
``InferenceRESTClient.is_server_live`` reads that field), so a client that does
not ask for HTML gets that JSON; a browser, which sends ``Accept: text/html``,
gets the page.

The page lists every model with its versions, states, load errors and times, labels,
signatures and size, and pre-fills an example request for each API the model
serves (:func:`served_hooks`): V1 ``:predict`` and V2 ``infer`` (zeros of the
right shape) for a model that predicts, OpenAI chat and completions for one
that generates, OpenAI embeddings for one that embeds.  The page is
self-contained (inline CSS and JS, no CDN), so it works where nothing outside
can be reached; every value is escaped by Jinja, and the example bodies travel
through ``tojson``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, render_template_string, request

from servekit.dataplane.repository import ModelVersion
from servekit.protocols.http import dataplane, json_response
from servekit.types import Signature, TensorSpec
from servekit.version import __version__

bp = Blueprint("status_page", __name__)

_TEMPLATE = Path(__file__).with_name("status_page.html")

_ZERO = {"BOOL": False, "BYTES": ""}
#: one URL, two representations: caches must key on Accept
_VARY = {"Vary": "Accept"}


@bp.get("/")
def root():
    """KServe V1 liveness (``{"status": "alive"}``); the status page when the client asks for HTML."""
    if not wants_html():
        return json_response({"status": "alive"}, headers=_VARY)
    return status_page()


def wants_html() -> bool:
    """The client names HTML and prefers it to JSON (a browser; curl's ``*/*`` is not asking)."""
    accept = request.accept_mimetypes
    html = accept["text/html"] if "text/html" in accept.values() else 0
    return bool(html) and html >= accept["application/json"]


def status_page():
    """Models, versions, states and metadata, with a form to send a request."""
    dp = dataplane()
    models = [_model_view(name, model) for name, model in sorted(dp.models.items())]
    html = render_template_string(
        _TEMPLATE.read_text(),
        version=__version__,
        ready=dp.ready,
        draining=dp.draining,
        models=models,
        examples={m["name"]: m["examples"] for m in models},
        size=readable_size,
        needs_key="servekit.api_key" in current_app.extensions,
    )
    return current_app.response_class(html, mimetype="text/html", headers=_VARY)


def _model_view(name: str, model: Any) -> dict[str, Any]:
    versions = [_version_view(mv) for _, mv in sorted(model.versions.items(), reverse=True)]
    serving = next((mv for mv in model.available()[::-1]), None)
    return {
        "name": name,
        "versions": versions,
        "labels": dict(model.config.labels),
        "config_error": model.config_error,
        "unloaded": model.unloaded,
        "evicted": model.evicted,
        "reason": model.reason,
        "bytes": model.bytes,
        "pinned": model.config.pin,
        "examples": _examples(name, serving) if serving else {},
    }


def _version_view(mv: ModelVersion) -> dict[str, Any]:
    return {
        "version": mv.version,
        "state": mv.state.value,
        "error": mv.error,
        "load_seconds": round(mv.load_seconds, 3),
        "platform": mv.metadata.platform,
        "signatures": {
            name: {
                "inputs": [_spec(t) for t in sig.inputs],
                "outputs": [_spec(t) for t in sig.outputs],
                "method": sig.method_name,
            }
            for name, sig in mv.metadata.signatures.items()
        },
    }


def _spec(t: TensorSpec) -> str:
    shape = "?" if t.shape is None else "[" + ", ".join(str(d) for d in t.shape) + "]"
    return f"{t.name}: {t.datatype} {shape}"


def readable_size(count: int) -> str:
    """A byte count as people read it: ``812 bytes``, ``1.4 kB``, ``90.9 MB``, ``7.2 GB`` (powers of 1000)."""
    if count < 1000:
        return f"{count} bytes" if count != 1 else "1 byte"
    value = float(count)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


#: The hooks that answer the page's example requests, in the order the page offers them.
API_HOOKS = ("predict", "complete", "embed")


def served_hooks(mv: ModelVersion) -> list[str]:
    """Which of ``predict``, ``complete`` and ``embed`` the version answers, as far as this
    process can tell without calling it.

    A hook answers when a plugin of the model implements it (wrappers, such as the
    batch-size metrics, answer nothing themselves).  A plugin that loads models of
    several kinds gives each model object the methods of its own kind (the Hugging
    Face plugin: a causal LM has ``complete``, an encoder ``embed`` and ``predict``, a
    cross-encoder ``predict``), and its hooks decline the others: a plugin's object with
    any of these methods narrows the APIs to its own (a ``model.py`` object, the text APIs).  A version in
    model hosts has its hooks there; a tokenizer copied back says it takes text.
    """
    if mv.loaded_by == "pipeline":
        return ["predict"]
    if mv.in_model_hosts:
        takes_text = _implements(mv.hooks, "tokenizer")
        return ["predict", "complete", "embed"] if takes_text else ["predict"]
    found = [hook for hook in API_HOOKS if _implements(mv.hooks, hook)]
    own = {hook for hook in API_HOOKS if callable(getattr(mv.model, hook, None))}
    if own and mv.loaded_by and not mv.loaded_by.startswith("model.py:"):
        return [hook for hook in found if hook in own]  # a plugin's object: its own methods, predict too
    if own & {"complete", "embed"}:
        found = [hook for hook in found if hook == "predict" or hook in own]
    return found


def _implements(hooks: Any, name: str) -> bool:
    caller = getattr(hooks, name, None) if hooks is not None else None
    if caller is None:
        return False
    return any(not (impl.wrapper or impl.hookwrapper) for impl in caller.get_hookimpls())


#: What the example requests send to a model that generates or embeds.
CHAT_EXAMPLE = "Say hello in five words."
PROMPT_EXAMPLE = "Once upon a time"
EMBED_EXAMPLE = ["servekit serves models.", "A second sentence to compare."]


def _examples(name: str, mv: ModelVersion) -> dict[str, Any]:
    """Example bodies for the form, one per request the version serves (:func:`served_hooks`)."""
    hooks = served_hooks(mv)
    examples: dict[str, Any] = {}
    if "complete" in hooks:
        examples["/v1/chat/completions"] = {
            "model": name,
            "messages": [{"role": "user", "content": CHAT_EXAMPLE}],
            "max_tokens": 32,
        }
        examples["/v1/completions"] = {"model": name, "prompt": PROMPT_EXAMPLE, "max_tokens": 32}
    if "embed" in hooks:
        examples["/v1/embeddings"] = {"model": name, "input": EMBED_EXAMPLE}
    if "predict" in hooks:
        examples.update(_predict_examples(name, mv))
    return examples


def _predict_examples(name: str, mv: ModelVersion) -> dict[str, Any]:
    """V1 ``:predict`` and V2 ``infer``: one row of zeros shaped like the default signature."""
    signature = mv.metadata.signature()
    if signature is None or not signature.inputs:
        return {
            f"/v1/models/{name}:predict": {"instances": [[0.0]]},
            f"/v2/models/{name}/infer": {
                "inputs": [{"name": "input_0", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]
            },
        }
    return {
        f"/v1/models/{name}:predict": {"instances": [_v1_row(signature)]},
        f"/v2/models/{name}/infer": {"inputs": [_v2_tensor(t) for t in signature.inputs]},
    }


def _row_shape(t: TensorSpec) -> list[int]:
    dims = list(t.shape or [-1])[1:]
    return [d if d > 0 else 1 for d in dims]


def _zeros(shape: list[int], datatype: str) -> Any:
    zero = _ZERO.get(datatype, 0.0 if datatype.startswith("FP") else 0)
    value: Any = zero
    for d in reversed(shape):
        value = [value] * d
    return value


def _v1_row(signature: Signature) -> Any:
    if len(signature.inputs) == 1:
        t = signature.inputs[0]
        return _zeros(_row_shape(t), t.datatype)
    return {t.name: _zeros(_row_shape(t), t.datatype) for t in signature.inputs}


def _v2_tensor(t: TensorSpec) -> dict[str, Any]:
    shape = [1, *_row_shape(t)]
    count = 1
    for d in shape:
        count *= d
    zero = _ZERO.get(t.datatype, 0.0 if t.datatype.startswith("FP") else 0)
    return {"name": t.name, "shape": shape, "datatype": t.datatype, "data": [zero] * count}
