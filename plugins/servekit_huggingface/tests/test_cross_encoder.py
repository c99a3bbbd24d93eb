"""Cross-encoders and classifiers in the Hugging Face plugin, in-process: which folders load
as which kind, scores equal to sentence-transformers' ``CrossEncoder``, probabilities equal
to transformers' pipeline, and the per-request settings (raw scores, truncation) that
TEI's routes pass on; encoders take TEI's embedding settings per request."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from generative_models import minilm_folder
from retrieval_models import LABELS, build_cross_encoder_folder, build_sequence_classifier
from servekit.errors import BadRequest
from servekit.types import ModelConfig

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
from servekit_huggingface import loader

QUERY = "what is deep learning"
PASSAGES = ["deep learning is a kind of machine learning", "cheese is made from milk", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("classifiers")
    return {
        "plain": build_sequence_classifier(root / "plain"),
        "cross_encoder": build_cross_encoder_folder(root / "cross-encoder", root),
        "classifier": build_sequence_classifier(root / "classifier", LABELS, seed=1),
    }


def texts(*values: str) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


def pairs_of(model, query, passages, **parameters):
    inputs = {"text": texts(*[query] * len(passages)), "text_pair": texts(*passages)}
    return model.predict(inputs, parameters)["scores"]


@pytest.mark.parametrize("kind", ["plain", "cross_encoder"])
def test_a_one_label_folder_scores_pairs_as_sentence_transformers_cross_encoder(folders, kind):
    from sentence_transformers import CrossEncoder

    model = loader.load_folder(folders[kind], ModelConfig())
    assert model.task == "score"
    expected = CrossEncoder(str(folders[kind]), device="cpu").predict([(QUERY, p) for p in PASSAGES])
    scores = pairs_of(model, QUERY, PASSAGES)
    assert scores.shape == (3,)
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    assert len(set(np.round(scores, 3))) == 3  # the tiny model tells the passages apart
    raw = pairs_of(model, QUERY, PASSAGES, raw_scores=True)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), expected, atol=1e-4)


def test_a_several_label_folder_classifies_as_transformers_pipeline(folders):
    from transformers import pipeline

    model = loader.load_folder(folders["classifier"], ModelConfig())
    assert model.task == "classify"
    signature = model.metadata().signature()
    assert [spec.name for spec in signature.inputs] == ["text", "text_pair"]
    (scores_spec,) = signature.outputs
    assert (scores_spec.name, scores_spec.shape, scores_spec.labels) == ("scores", [-1, 3], list(LABELS))
    classify = pipeline("text-classification", model=str(folders["classifier"]), top_k=None, device="cpu")
    sentences = ["I like this a lot", "this is terrible"]
    probabilities = model.predict({"text": texts(*sentences)}, {})["scores"]
    for row, expected in zip(probabilities, classify(sentences)):
        assert dict(zip(LABELS, row.tolist())) == pytest.approx({p["label"]: p["score"] for p in expected}, abs=1e-4)
    raw = model.predict({"text": texts(*sentences)}, {"raw_scores": True})["scores"]
    np.testing.assert_allclose(np.exp(raw) / np.exp(raw).sum(axis=1, keepdims=True), probabilities, atol=1e-5)


def test_options_task_overrides_the_guess(folders, tmp_path):
    assert (
        loader.load_folder(folders["classifier"], ModelConfig(options={"task": "embed"})).__class__.__name__
        == "Encoder"
    )
    with pytest.raises(loader.LoadError, match="one label"):
        loader.load_folder(folders["classifier"], ModelConfig(options={"task": "score"}))
    with pytest.raises(loader.LoadError, match="classify"):
        loader.load_folder(folders["classifier"], ModelConfig(options={"task": "rank"}))
    # a sentence-transformers embedder folder (modules.json) stays an embedder
    assert loader.task_of(minilm_folder(), json.loads((minilm_folder() / "config.json").read_text()), {}) == "embed"


def test_an_input_past_the_models_length_is_refused_unless_truncated(folders):
    model = loader.load_folder(folders["plain"], ModelConfig())
    long_query = "word " * 100
    with pytest.raises(BadRequest, match="must have less than 64 tokens"):
        pairs_of(model, long_query, ["a"])
    right = pairs_of(model, long_query + "tail end", ["a"], truncate=True)
    left = pairs_of(model, long_query + "tail end", ["a"], truncate=True, truncation_direction="left")
    assert right.shape == left.shape == (1,)
    with pytest.raises(BadRequest, match="truncation_direction"):
        pairs_of(model, "q", ["a"], truncation_direction="middle")
    truncating = loader.load_folder(folders["plain"], ModelConfig(options={"truncate": True}))
    assert pairs_of(truncating, long_query, ["a"]).shape == (1,)


def test_v1_rows_of_text_and_text_pair_score_like_named_tensors(folders):
    model = loader.load_folder(folders["plain"], ModelConfig())
    rows = np.array([[QUERY, p] for p in PASSAGES], dtype=object)
    np.testing.assert_allclose(model.predict(rows, {})["scores"], pairs_of(model, QUERY, PASSAGES), atol=1e-6)


@pytest.fixture(scope="module")
def prompted_minilm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prompted") / "minilm"
    shutil.copytree(minilm_folder(), folder)
    config_file = folder / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config["prompts"] = {"query": "query: "}
    config_file.write_text(json.dumps(config))
    return folder


def test_encoders_take_teis_embedding_settings_per_request(prompted_minilm):
    from sentence_transformers import SentenceTransformer

    model = loader.load_folder(prompted_minilm, ModelConfig())
    reference = SentenceTransformer(str(prompted_minilm), device="cpu")
    prompted = model.embed(["deep learning"], {"prompt_name": "query"})
    np.testing.assert_allclose(
        prompted, reference.encode(["deep learning"], prompt_name="query", normalize_embeddings=True), atol=1e-5
    )
    unnormalized = model.embed(["deep learning"], {"normalize": False})
    assert abs(float(np.linalg.norm(unnormalized)) - 1.0) > 1e-3
    with pytest.raises(BadRequest, match="prompt_name 'passage'"):
        model.embed(["x"], {"prompt_name": "passage"})
    with pytest.raises(BadRequest, match="tokens"):
        model.embed(["word " * 300])
    assert model.embed(["word " * 300], {"truncate": True}).shape == (1, 384)
    signature = model.metadata().signature()
    assert ([s.name for s in signature.inputs], [s.name for s in signature.outputs]) == (["text"], ["embedding"])
