"""Retrieval routes in the shapes clients already speak: TEI's API and vLLM's (Jina's, Cohere's) rerank and score.

Hugging Face's text-embeddings-inference (TEI): ``POST /embed``, ``/rerank`` (with
``texts``), ``/predict`` (with ``inputs``; ``/predict`` with ``instances`` stays the
generic route), ``/similarity``, ``/tokenize``, ``/decode``; ``GET /info`` and ``/health``.  Errors take
TEI's shape, ``{"error": message, "error_type": kind}``, with its statuses: an
empty batch 400 (``empty``), a field it cannot read, too many inputs or an input
past the model's length 422 (``validation``), a model of the wrong kind 424
(``backend``).

vLLM's ``POST /score`` (``/v1/score``) and its Jina/Cohere-compatible ``/rerank``
(with ``documents``), ``/v1/rerank`` and ``/v2/rerank``, and its ``/tokenize`` (with
``prompt`` or ``messages``) and ``/detokenize`` (:mod:`.vllm_tokens`); errors take OpenAI's shape.

The model: ``model`` in the body (``?model=`` on the GET routes); without it, the
only served model of the kind the route needs (a cross-encoder for rerank and score,
a classifier with several labels for ``/predict``, where a named cross-encoder answers
too, an embedder for ``/embed``), and a 400 naming the candidates when several fit.  The kind is read from the model's
metadata, as the Hugging Face plugin writes it: ``text`` (and ``text_pair``) in;
``scores`` (``[n]``: cross-encoder, ``[n, labels]`` with labels: classifier) or
``embedding`` out.  Any model whose ``predict`` answers those tensors serves here.

Every field these APIs define that servekit does not honour is refused with a
400/422 naming it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

import numpy as np
from flask import Blueprint, current_app, request

from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import BadRequest, NotImplementedByModel, ServekitError, openai_error
from servekit.protocols import vllm_tokens
from servekit.protocols.http import Answer, dataplane, json_answer, parse_json_object
from servekit.version import __version__

bp = Blueprint("retrieval", __name__)

#: TEI's default ``--max-client-batch-size``: the most inputs (texts) one request may carry.
MAX_CLIENT_BATCH_SIZE = 32

RERANKER, CLASSIFIER, EMBEDDER = "reranker", "classifier", "embedding"


class Empty(BadRequest):
    """TEI's ``empty`` error: a batch with nothing in it (400)."""


class WrongKind(BadRequest):
    """The model cannot answer this route (TEI answers 424 ``backend``)."""


class Ambiguous(BadRequest):
    """Several served models fit a route and the request named none (400 on every route)."""


# -- errors in each API's shape ----------------------------------------------------------------


def _tei_error(exc: ServekitError) -> Answer:
    if isinstance(exc, Empty):
        status, kind = 400, "empty"
    elif isinstance(exc, Ambiguous):
        status, kind = 400, "validation"
    elif isinstance(exc, WrongKind | NotImplementedByModel):
        status, kind = 424, "backend"
    elif isinstance(exc, BadRequest):
        status, kind = 422, "validation"
    elif exc.status == 429:
        status, kind = 429, "overloaded"
    elif exc.status == 503:
        status, kind = 503, "unhealthy"
    else:
        status, kind = exc.status, "validation" if exc.status < 500 else "backend"
    return json_answer({"error": exc.message, "error_type": kind}, status)


def _openai_error(exc: ServekitError) -> Answer:
    return json_answer(openai_error(exc), exc.status)


def answers(render: Callable[[ServekitError], Answer]) -> Callable[[Callable[..., Any]], Callable[..., Answer]]:
    """A handler whose :class:`ServekitError` becomes the API's own error body."""

    def decorate(handler: Callable[..., Any]) -> Callable[..., Answer]:
        @wraps(handler)
        def run(*args: Any, **kwargs: Any) -> Answer:
            try:
                return handler(*args, **kwargs)
            except ServekitError as exc:
                return render(exc)

        return run

    return decorate


# -- which model ---------------------------------------------------------------------------------


def kind_of(mv: ModelVersion) -> str | None:
    """``reranker``, ``classifier`` or ``embedding`` from the model's metadata, ``None`` for anything else."""
    signature = mv.metadata.signature()
    if signature is None:
        return None
    outputs = {spec.name: spec for spec in signature.outputs}
    if "embedding" in outputs:
        return EMBEDDER
    scores = outputs.get("scores")
    if scores is None or not {spec.name for spec in signature.inputs} >= {"text"}:
        return None
    return RERANKER if scores.shape is not None and len(scores.shape) == 1 else CLASSIFIER


def pick_model(dp: DataPlane, name: Any, kinds: tuple[str, ...], route: str, any_named: bool = False) -> ModelVersion:
    """The model ``name`` names, else the only served model of one of ``kinds``.

    With ``any_named``, a named model of any kind is taken (its hook, or its tokenizer,
    answers or says it cannot): ``/embed`` for any model with an ``embed`` hook,
    ``/tokenize`` and ``/decode`` for any model with a tokenizer.
    """
    if name is not None:
        if not isinstance(name, str):
            raise BadRequest(f"'model' must be a string, found {name!r}", param="model")
        mv = dp.resolve(name)
        if not any_named and kind_of(mv) not in kinds:
            raise WrongKind(f"model {name!r} is not a {' or '.join(kinds)} model; {route} needs one", param="model")
        return mv
    fits = []
    for served in dp.model_names():
        try:
            mv = dp.resolve(served)
        except ServekitError:
            continue
        if kind_of(mv) in kinds:
            fits.append(mv)
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise WrongKind(f"model is not a {' or '.join(kinds)} model: no served model answers {route}")
    names = ", ".join(sorted(mv.name for mv in fits))
    raise Ambiguous(f"several models answer {route} ({names}); name one with 'model'", param="model")


# -- reading bodies --------------------------------------------------------------------------------


def _refuse_unknown(body: dict[str, Any], known: tuple[str, ...], route: str) -> None:
    for key, value in body.items():
        if key == "parameters" and isinstance(value, dict):  # huggingface_hub's task parameters, unset
            _refuse_unknown({f"parameters.{k}": v for k, v in value.items()}, (), route)
        elif key not in known and value is not None:
            raise BadRequest(f"'{key}' is not supported by servekit's {route}", param=key)


def _bool(body: dict[str, Any], key: str, default: bool | None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false, found {value!r}", param=key)
    return value


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string, found {value!r}", param=key)
    return value


def _strings(body: dict[str, Any], key: str, *, single: bool = False) -> list[str]:
    value = body.get(key)
    if single and isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{key}' must be a list of strings", param=key)
    return value


def _direction(body: dict[str, Any]) -> str:
    value = body.get("truncation_direction")
    if value is None:
        return "right"
    if not isinstance(value, str) or value.lower() not in ("left", "right"):
        raise BadRequest(f"'truncation_direction' must be Left or Right, found {value!r}", param="truncation_direction")
    return value.lower()


def _check_batch(count: int, key: str) -> None:
    if count == 0:
        raise Empty(f"`{key}` cannot be empty", param=key)
    if count > MAX_CLIENT_BATCH_SIZE:
        raise BadRequest(f"batch size {count} > maximum allowed batch size {MAX_CLIENT_BATCH_SIZE}", param=key)


def _objects(values: list[str]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def scores_of(
    dp: DataPlane, mv: ModelVersion, texts: list[str], pairs: list[str] | None, parameters: dict[str, Any]
) -> np.ndarray:
    """The model's ``scores`` for texts (and pairs): ``[n]`` or ``[n, labels]``."""
    inputs = {"text": _objects(texts)}
    if pairs is not None:
        inputs["text_pair"] = _objects(pairs)
    outputs = dp.predict(mv, inputs, parameters=parameters)
    if not isinstance(outputs, dict) or "scores" not in outputs:
        raise BadRequest(f"model {mv.name!r} answered no 'scores'")
    return np.asarray(outputs["scores"], dtype=np.float32)


def _token_count(dp: DataPlane, mv: ModelVersion, texts: list[str], pairs: list[str] | None) -> int:
    tokenizer = dp.tokenizer(mv)
    if tokenizer is None or not callable(tokenizer):
        return 0
    encoded = tokenizer(texts, pairs) if pairs is not None else tokenizer(texts)
    return sum(len(ids) for ids in encoded["input_ids"])


# -- TEI -----------------------------------------------------------------------------------------

TEI_SCORE_FIELDS = ("model", "raw_scores", "truncate", "truncation_direction")


@answers(_tei_error)
def tei_rerank(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _refuse_unknown(body, ("query", "texts", "return_text", *TEI_SCORE_FIELDS), "/rerank")
    query = _string(body, "query")
    texts = _strings(body, "texts")
    _check_batch(len(texts), "texts")
    return_text = _bool(body, "return_text", False)
    mv = pick_model(dp, body.get("model"), (RERANKER,), "/rerank")
    parameters = {
        "raw_scores": _bool(body, "raw_scores", False),
        "truncate": _bool(body, "truncate", None),
        "truncation_direction": _direction(body),
    }
    scores = scores_of(dp, mv, [query] * len(texts), texts, parameters)
    order = sorted(range(len(texts)), key=lambda i: -float(scores[i]))
    ranks = []
    for index in order:
        rank: dict[str, Any] = {"index": index, "score": float(scores[index])}
        if return_text:
            rank["text"] = texts[index]
        ranks.append(rank)
    return json_answer(ranks)


def _predict_inputs(value: Any) -> tuple[bool, list[list[str]]]:
    """TEI's ``inputs`` for /predict: a text, a pair ``[a, b]``, or a batch ``[[a], [a, b], ...]``."""
    if isinstance(value, str):
        return True, [[value]]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if len(value) > 2:
            raise BadRequest(
                f"`inputs` is a text or a pair [text, text_pair], found a list of {len(value)}", param="inputs"
            )
        return True, [value]
    if isinstance(value, list) and all(isinstance(v, list) for v in value):
        for item in value:
            if not 1 <= len(item) <= 2 or not all(isinstance(s, str) for s in item):
                raise BadRequest("each item of `inputs` must be [text] or [text, text_pair]", param="inputs")
        return False, value
    if value == []:
        return False, []
    raise BadRequest("`inputs` must be a text, a pair [text, text_pair] or a batch of them", param="inputs")


@answers(_tei_error)
def tei_predict(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _refuse_unknown(body, ("inputs", *TEI_SCORE_FIELDS), "/predict")
    single, items = _predict_inputs(body.get("inputs"))
    _check_batch(len(items), "inputs")
    name = body.get("model")
    # unnamed, the only classifier (several labels); a cross-encoder answers when named
    mv = pick_model(dp, name, (CLASSIFIER,) if name is None else (CLASSIFIER, RERANKER), "/predict")
    parameters = {
        "raw_scores": _bool(body, "raw_scores", False),
        "truncate": _bool(body, "truncate", None),
        "truncation_direction": _direction(body),
    }
    labels = _labels(mv)
    results = []
    # singles and pairs go to the model in two calls (a pair's text_pair is not optional per row)
    for paired in (False, True):
        rows = [i for i, item in enumerate(items) if (len(item) == 2) == paired]
        if not rows:
            continue
        pairs = [items[i][1] for i in rows] if paired else None
        scores = scores_of(dp, mv, [items[i][0] for i in rows], pairs, parameters)
        scores = scores.reshape(len(rows), -1)
        for row, values in zip(rows, scores):
            best_first = sorted(enumerate(values.tolist()), key=lambda pair: -pair[1])
            ranked = [{"score": score, "label": labels[j] if j < len(labels) else str(j)} for j, score in best_first]
            results.append((row, ranked))
    results.sort(key=lambda item: item[0])
    predictions = [ranked for _, ranked in results]
    return json_answer(predictions[0] if single else predictions)


def _labels(mv: ModelVersion) -> list[str]:
    signature = mv.metadata.signature()
    for spec in signature.outputs if signature else []:
        if spec.name == "scores":
            return list(spec.labels or (["LABEL_0"] if spec.shape and len(spec.shape) == 1 else []))
    return []


@answers(_tei_error)
def tei_embed(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _refuse_unknown(
        body,
        ("inputs", "model", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"),
        "/embed",
    )
    texts = _strings(body, "inputs", single=True) if not _is_ids(body.get("inputs")) else None
    if texts is None:
        raise BadRequest("token-id `inputs` are not supported by servekit's /embed; send text", param="inputs")
    _check_batch(len(texts), "inputs")
    normalize = _bool(body, "normalize", True)
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise BadRequest(f"'dimensions' must be a positive integer, found {dimensions!r}", param="dimensions")
    prompt_name = body.get("prompt_name")
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise BadRequest(f"'prompt_name' must be a string, found {prompt_name!r}", param="prompt_name")
    mv = pick_model(dp, body.get("model"), (EMBEDDER,), "/embed", any_named=True)
    parameters = {
        "normalize": False if dimensions is not None else normalize,
        "truncate": _bool(body, "truncate", None),
        "truncation_direction": _direction(body),
        "prompt_name": prompt_name,
    }
    vectors = np.asarray(dp.embed(mv, texts, {k: v for k, v in parameters.items() if v is not None}), dtype=np.float32)
    if dimensions is not None:
        if dimensions > vectors.shape[1]:
            raise BadRequest(
                f"'dimensions' is {dimensions} but the model's embeddings have {vectors.shape[1]}", param="dimensions"
            )
        vectors = vectors[:, :dimensions]
        if normalize:  # Matryoshka: cut, then normalise (as TEI does)
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)
    return json_answer(vectors.astype(np.float32).tolist())


@answers(_tei_error)
def tei_similarity(dp: DataPlane, body: dict[str, Any]) -> Answer:
    """TEI's ``/similarity`` (huggingface_hub's sentence similarity): the cosine similarity of
    ``inputs.source_sentence`` to each of ``inputs.sentences``, from the model's embeddings."""
    _refuse_unknown({k: v for k, v in body.items() if k != "parameters"}, ("inputs", "model"), "/similarity")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest(f"'parameters' must be an object, found {parameters!r}", param="parameters")
    _refuse_unknown(
        {f"parameters.{k}": v for k, v in parameters.items()},
        ("parameters.truncate", "parameters.truncation_direction", "parameters.prompt_name"),
        "/similarity",
    )
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise BadRequest("'inputs' must be an object with 'source_sentence' and 'sentences'", param="inputs")
    _refuse_unknown(
        {f"inputs.{k}": v for k, v in inputs.items()}, ("inputs.source_sentence", "inputs.sentences"), "/similarity"
    )
    source = _string({"inputs.source_sentence": inputs.get("source_sentence")}, "inputs.source_sentence")
    sentences = _strings({"inputs.sentences": inputs.get("sentences")}, "inputs.sentences")
    if not sentences:
        raise Empty("`inputs.sentences` cannot be empty", param="inputs.sentences")
    _check_batch(len(sentences) + 1, "inputs.sentences")  # the source sentence is embedded with them
    prompt_name = parameters.get("prompt_name")
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise BadRequest(f"'prompt_name' must be a string, found {prompt_name!r}", param="parameters.prompt_name")
    mv = pick_model(dp, body.get("model"), (EMBEDDER,), "/similarity", any_named=True)
    options = {
        "normalize": True,
        "truncate": _bool(parameters, "truncate", None),
        "truncation_direction": _direction(parameters),
        "prompt_name": prompt_name,
    }
    vectors = np.asarray(dp.embed(mv, [source, *sentences], {k: v for k, v in options.items() if v is not None}))
    vectors = vectors.astype(np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    similarity = vectors[1:] @ vectors[0] / np.where(norms[1:] * norms[0] == 0, 1, norms[1:] * norms[0])
    return json_answer(similarity.astype(np.float32).tolist())


def _is_ids(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return any(isinstance(v, int) or (isinstance(v, list) and v and isinstance(v[0], int)) for v in items)


def _tokenizer_of(dp: DataPlane, mv: ModelVersion) -> Any:
    tokenizer = dp.tokenizer(mv)
    if tokenizer is None:
        raise WrongKind(f"model {mv.name!r} has no tokenizer")
    return tokenizer


ANY_TEXT_MODEL = (EMBEDDER, RERANKER, CLASSIFIER)


@answers(_tei_error)
def tei_tokenize(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _refuse_unknown(body, ("inputs", "model", "add_special_tokens", "prompt_name"), "/tokenize")
    texts = _strings(body, "inputs", single=True)
    _check_batch(len(texts), "inputs")
    if body.get("prompt_name") is not None:
        raise BadRequest("'prompt_name' is not supported by servekit's /tokenize", param="prompt_name")
    add_special = _bool(body, "add_special_tokens", True)
    mv = pick_model(dp, body.get("model"), ANY_TEXT_MODEL, "/tokenize", any_named=True)
    tokenizer = _tokenizer_of(dp, mv)
    encoded = tokenizer(texts, add_special_tokens=add_special, return_offsets_mapping=True)
    special = set(getattr(tokenizer, "all_special_ids", []))
    out = []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        tokens = []
        for token_id, (start, stop) in zip(ids, offsets):
            is_special = token_id in special
            tokens.append(
                {
                    "id": int(token_id),
                    "text": tokenizer.convert_ids_to_tokens(token_id) if is_special else text[start:stop],
                    "special": is_special,
                    "start": None if is_special else int(start),
                    "stop": None if is_special else int(stop),
                }
            )
        out.append(tokens)
    return json_answer(out)


@answers(_tei_error)
def tei_decode(dp: DataPlane, body: dict[str, Any]) -> Answer:
    _refuse_unknown(body, ("ids", "model", "skip_special_tokens"), "/decode")
    ids = body.get("ids")
    batch = [ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else ids
    if not isinstance(batch, list) or not all(
        isinstance(row, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in row)
        for row in batch
    ):
        raise BadRequest("'ids' must be a list of token ids or a list of such lists", param="ids")
    _check_batch(len(batch), "ids")
    skip = _bool(body, "skip_special_tokens", True)
    mv = pick_model(dp, body.get("model"), ANY_TEXT_MODEL, "/decode", any_named=True)
    tokenizer = _tokenizer_of(dp, mv)
    size = len(tokenizer)
    for row in batch:
        for token_id in row:
            if token_id >= size:
                raise BadRequest(f"token id {token_id} is outside the vocabulary ({size} tokens)", param="ids")
    return json_answer([tokenizer.decode(row, skip_special_tokens=skip) for row in batch])


@answers(_tei_error)
def tei_info(dp: DataPlane, name: str | None) -> Answer:
    mv = pick_model(dp, name, ANY_TEXT_MODEL, "/info")
    kind = kind_of(mv)
    if kind == EMBEDDER:
        pooling = (getattr(mv.model, "pooling", None) or ["mean"])[0]  # the Hugging Face encoder's first mode
        model_type: dict[str, Any] = {"embedding": {"pooling": "last_token" if pooling == "lasttoken" else pooling}}
    else:
        labels = _labels(mv)
        model_type = {
            str(kind): {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        }
    tokenizer = dp.tokenizer(mv)
    max_length = int(getattr(mv.model, "max_length", None) or getattr(tokenizer, "model_max_length", None) or 512)
    batch_rows = int(getattr(mv.model, "batch_size", None) or 32)
    settings = current_app.extensions.get("servekit.settings")
    info = {
        "model_id": mv.name,
        "model_sha": None,
        "model_dtype": str(getattr(getattr(mv.model, "model", None), "dtype", "float32")).removeprefix("torch."),
        "served_model_name": mv.name,
        "model_type": model_type,
        # what this server holds to: its threads per worker, the model's rows per forward pass
        "max_concurrent_requests": int(getattr(settings, "threads", 16)),
        "max_input_length": max_length,
        # the most padded tokens a pass holds: the budget, or fewer where the rows cap it first
        "max_batch_tokens": min(int(getattr(mv.model, "max_batch_tokens", None) or 1 << 62), batch_rows * max_length),
        "max_batch_requests": batch_rows,
        "max_client_batch_size": MAX_CLIENT_BATCH_SIZE,
        "auto_truncate": bool(getattr(mv.model, "truncate", False)),
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }
    return json_answer(info)


# -- vLLM, Jina, Cohere ---------------------------------------------------------------------------


def _activation(body: dict[str, Any]) -> bool:
    """vLLM's ``use_activation`` (older ``activation``): false answers the raw logits."""
    use = _bool(body, "use_activation", None)
    return bool(_bool(body, "activation", True)) if use is None else use


@answers(_openai_error)
def vllm_rerank(dp: DataPlane, body: dict[str, Any], route: str) -> Answer:
    _refuse_unknown(
        body, ("model", "query", "documents", "top_n", "return_documents", "use_activation", "activation"), route
    )
    query = _string(body, "query")
    documents = body.get("documents")
    if isinstance(documents, list) and all(isinstance(d, dict) and isinstance(d.get("text"), str) for d in documents):
        documents = [d["text"] for d in documents]  # Cohere's v1 {"text": ...} documents
    else:
        documents = _strings(body, "documents")
    if not documents:
        raise BadRequest("'documents' cannot be empty", param="documents")
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise BadRequest(f"'top_n' must be a non-negative integer, found {top_n!r}", param="top_n")
    return_documents = _bool(body, "return_documents", True)
    raw = not _activation(body)
    mv = pick_model(dp, body.get("model"), (RERANKER,), route)
    scores = scores_of(dp, mv, [query] * len(documents), documents, {"raw_scores": raw})
    order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
    if top_n:
        order = order[:top_n]
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
        if return_documents:
            result["document"] = {"text": documents[index]}
        results.append(result)
    tokens = _token_count(dp, mv, [query] * len(documents), documents)
    return json_answer(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": mv.name,
            "usage": {"total_tokens": tokens},
            "results": results,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        }
    )


@answers(_openai_error)
def vllm_score(dp: DataPlane, body: dict[str, Any], route: str) -> Answer:
    _refuse_unknown(body, ("model", "text_1", "text_2", "use_activation", "activation"), route)
    first = _strings(body, "text_1", single=True)
    second = _strings(body, "text_2", single=True)
    if not first or not second:
        raise BadRequest("'text_1' and 'text_2' cannot be empty", param="text_1" if not first else "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise BadRequest(
            f"'text_1' has {len(first)} texts and 'text_2' {len(second)}: send one text_1, or as many as text_2",
            param="text_2",
        )
    raw = not _activation(body)
    mv = pick_model(dp, body.get("model"), (RERANKER,), route)
    scores = scores_of(dp, mv, first, second, {"raw_scores": raw})
    tokens = _token_count(dp, mv, first, second)
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]
    return json_answer(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": mv.name,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
    )


# -- routes ----------------------------------------------------------------------------------------


def _body(render: Callable[[ServekitError], Answer]) -> dict[str, Any] | Answer:
    try:
        return parse_json_object(request.get_data(cache=False))
    except ServekitError as exc:
        return render(exc)


@bp.post("/embed")
def embed():
    body = _body(_tei_error)
    return (body if isinstance(body, Answer) else tei_embed(dataplane(), body)).response()


@bp.post("/rerank")
def rerank():
    """TEI's rerank (``texts``) or vLLM's Jina-compatible one (``documents``), told apart by the body."""
    body = _body(_tei_error)
    if isinstance(body, Answer):
        return body.response()
    if "documents" in body and "texts" not in body:
        return vllm_rerank(dataplane(), body, "/rerank").response()
    return tei_rerank(dataplane(), body).response()


@bp.post("/similarity")
def similarity():
    body = _body(_tei_error)
    return (body if isinstance(body, Answer) else tei_similarity(dataplane(), body)).response()


@bp.post("/tokenize")
def tokenize():
    """TEI's tokenize (``inputs``) or vLLM's (``prompt`` or ``messages``), told apart by the body."""
    body = _body(_tei_error)
    if isinstance(body, Answer):
        return body.response()
    if vllm_tokens.is_vllm_tokenize(body):
        return vllm_tokens.tokenize(dataplane(), body).response()
    return tei_tokenize(dataplane(), body).response()


@bp.post("/detokenize")
def detokenize():
    """vLLM's detokenize (TEI's is ``/decode``)."""
    body = _body(_openai_error)
    return (body if isinstance(body, Answer) else vllm_tokens.detokenize(dataplane(), body)).response()


@bp.post("/decode")
def decode():
    body = _body(_tei_error)
    return (body if isinstance(body, Answer) else tei_decode(dataplane(), body)).response()


@bp.get("/info")
def info():
    return tei_info(dataplane(), request.args.get("model")).response()


@bp.get("/health")
def health():
    """TEI's probe: 200 with an empty body when every model is ready, else 503."""
    ready, reason = dataplane().readiness()
    if ready:
        return Answer(b"", 200).response()
    return json_answer({"error": reason or "unhealthy", "error_type": "unhealthy"}, 503).response()


@bp.post("/v1/rerank")
@bp.post("/v2/rerank")
def rerank_v1_v2():
    body = _body(_openai_error)
    return (body if isinstance(body, Answer) else vllm_rerank(dataplane(), body, request.path)).response()


@bp.post("/score")
@bp.post("/v1/score")
def score():
    body = _body(_openai_error)
    return (body if isinstance(body, Answer) else vllm_score(dataplane(), body, request.path)).response()


def predict_answer(dp: DataPlane, body: dict[str, Any]) -> Answer:
    """TEI's ``POST /predict`` (a body with ``inputs``), for the generic route to hand on."""
    return tei_predict(dp, body)


__all__ = ["MAX_CLIENT_BATCH_SIZE", "bp", "kind_of", "pick_model", "predict_answer"]
