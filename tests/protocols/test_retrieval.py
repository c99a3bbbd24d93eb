"""The retrieval routes' wire shapes (TEI, vLLM, Jina, Cohere) in-process: which model
each route takes, every field refused that servekit does not honour, each API's error
bodies and statuses, and V1/V2 serving the same cross-encoders and classifiers."""

from __future__ import annotations

import shutil

import pytest
from generative_models import build_tiny_gpt2, minilm_folder
from lazy_modules import lazy_module
from retrieval_models import LABELS, build_sequence_classifier

pytestmark = pytest.mark.slow  # the models need torch
lazy_module("torch")  # looked up, not imported: the servers import it


def make_client(*paths, **settings):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[str(p) for p in paths], poll_interval=0, **settings), start=False)
    app.extensions["servekit"].repository.load_now()
    return app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval") / "models"
    build_sequence_classifier(root / "reranker")
    build_sequence_classifier(root / "sentiment", LABELS, seed=1)
    shutil.copytree(minilm_folder(), root / "embedder")
    build_tiny_gpt2(root / "writer", n_positions=64)
    app = make_client(root)
    yield app
    app.extensions["servekit"].repository.stop()


@pytest.fixture
def client(app):
    return app.test_client()


def test_tei_routes_default_to_the_only_model_that_fits(client):
    ranks = client.post("/rerank", json={"query": "q", "texts": ["a", "b c"]}).get_json()
    assert sorted(r["index"] for r in ranks) == [0, 1] and ranks[0]["score"] >= ranks[1]["score"]
    assert "text" not in ranks[0]
    classified = client.post("/predict", json={"inputs": "I like it"}).get_json()
    assert sorted(p["label"] for p in classified) == sorted(LABELS)
    assert classified[0]["score"] >= classified[-1]["score"]
    (vector,) = client.post("/embed", json={"inputs": "hello"}).get_json()
    assert len(vector) == 384


def test_embed_cuts_dimensions_then_normalises_as_tei(client):
    import numpy as np

    full = np.asarray(client.post("/embed", json={"inputs": ["hello"], "normalize": False}).get_json())
    cut = np.asarray(client.post("/embed", json={"inputs": ["hello"], "dimensions": 8}).get_json())
    np.testing.assert_allclose(cut, full[:, :8] / np.linalg.norm(full[:, :8]), atol=1e-5)
    too_wide = client.post("/embed", json={"inputs": ["hello"], "dimensions": 1000})
    assert too_wide.status_code == 422 and "dimensions" in too_wide.get_json()["error"]


def test_the_model_is_named_with_model_and_a_wrong_kind_answers_teis_424(client):
    named = client.post("/predict", json={"inputs": ["q", "d"], "model": "reranker"})
    assert [p["label"] for p in named.get_json()] == ["LABEL_0"]
    for body in (
        {"model": "writer", "query": "q", "texts": ["a"]},
        {"model": "embedder", "query": "q", "texts": ["a"]},
    ):
        wrong = client.post("/rerank", json=body)
        assert wrong.status_code == 424
        assert wrong.get_json() == {
            "error": f"model {body['model']!r} is not a reranker model; /rerank needs one",
            "error_type": "backend",
        }
    generator = client.post("/embed", json={"model": "writer", "inputs": "q"})
    assert (generator.status_code, generator.get_json()["error_type"]) == (424, "backend")
    (tokens,) = client.post(
        "/tokenize", json={"model": "writer", "inputs": "hello", "add_special_tokens": False}
    ).get_json()
    assert "".join(t["text"] for t in tokens) == "hello"
    unknown = client.post("/rerank", json={"model": "nope", "query": "q", "texts": ["a"]})
    assert unknown.status_code == 404 and unknown.get_json()["error_type"] == "validation"
    vllm = client.post("/v2/rerank", json={"model": "writer", "query": "q", "documents": ["a"]})
    assert vllm.status_code == 400 and vllm.get_json()["error"]["param"] == "model"


def test_several_models_that_fit_and_none_named_is_a_4xx_naming_them(app, tmp_path):
    root = tmp_path / "models"
    build_sequence_classifier(root / "first")
    build_sequence_classifier(root / "second", seed=2)
    two = make_client(root, fast_lane=False)  # Flask's own routes, /predict among them
    try:
        classified = two.test_client().post("/predict", json={"inputs": ["q", "d"], "model": "first"})
        assert [p["label"] for p in classified.get_json()] == ["LABEL_0"]
        answer = two.test_client().post("/rerank", json={"query": "q", "texts": ["a"]})
        assert answer.status_code == 400
        assert "first, second" in answer.get_json()["error"]
        vllm = two.test_client().post("/score", json={"text_1": "q", "text_2": ["a"]})
        assert vllm.status_code == 400 and "first, second" in vllm.get_json()["error"]["message"]
        no_classifier = two.test_client().post("/predict", json={"inputs": "q"})
        assert no_classifier.status_code == 424
        named = two.test_client().post("/rerank", json={"query": "q", "texts": ["a"], "model": "second"})
        assert named.status_code == 200
    finally:
        two.extensions["servekit"].repository.stop()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/rerank", {"query": "q", "texts": ["a"], "max_tokens": 3}, "max_tokens"),
        ("/embed", {"inputs": "a", "encoding_format": "base64"}, "encoding_format"),
        ("/predict", {"inputs": "a", "parameters": {"top_k": 2}}, "parameters.top_k"),
        ("/tokenize", {"inputs": "a", "model": "embedder", "prompt_name": "query"}, "prompt_name"),
        ("/decode", {"ids": [1], "model": "embedder", "clean_up": True}, "clean_up"),
    ],
)
def test_a_tei_field_servekit_does_not_honour_is_refused_naming_it(client, path, body, field):
    answer = client.post(path, json=body)
    assert answer.status_code == 422
    assert answer.get_json()["error_type"] == "validation" and field in answer.get_json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": 3}, "max_tokens_per_doc"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ("/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
        ("/score", {"text_1": "q", "text_2": ["a"], "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
        ("/v1/score", {"text_1": ["q", "r"], "text_2": ["a", "b", "c"]}, "text_2"),
    ],
)
def test_a_vllm_field_servekit_does_not_honour_answers_openais_400(client, path, body, field):
    answer = client.post(path, json=body)
    assert answer.status_code == 400
    assert answer.get_json()["error"]["param"] == field


def test_vllm_score_pairs_one_text_with_many_and_many_with_many(client):
    one_to_many = client.post("/score", json={"text_1": "q", "text_2": ["a", "b"]}).get_json()
    pairwise = client.post("/v1/score", json={"text_1": ["q", "q"], "text_2": ["a", "b"]}).get_json()
    assert [d["score"] for d in one_to_many["data"]] == pytest.approx([d["score"] for d in pairwise["data"]])
    assert one_to_many["object"] == "list" and one_to_many["model"] == "reranker"
    assert [d["object"] for d in one_to_many["data"]] == ["score", "score"]
    raw = client.post("/score", json={"text_1": "q", "text_2": ["a"], "use_activation": False}).get_json()
    assert raw["data"][0]["score"] != pytest.approx(one_to_many["data"][0]["score"])


def test_jina_rerank_honours_top_n_and_return_documents(client):
    answer = client.post(
        "/rerank", json={"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": False}
    )
    results = answer.get_json()["results"]
    assert len(results) == 2 and "document" not in results[0]
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]


def test_similarity_is_the_cosine_of_the_embeddings_and_refuses_what_it_cannot_read(client):
    import numpy as np

    sentences = ["a cat sat", "the stock fell", "a kitten sat"]
    body = {"inputs": {"source_sentence": "a cat sits", "sentences": sentences}, "parameters": {"truncate": True}}
    similarity = client.post("/similarity", json=body).get_json()
    vectors = np.asarray(client.post("/embed", json={"inputs": ["a cat sits", *sentences]}).get_json())
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=1e-5)
    assert similarity[2] > similarity[1]
    for wrong, field, status in [
        ({"inputs": {"source_sentence": "a", "sentences": []}}, "inputs.sentences", 400),
        ({"inputs": {"source_sentence": 1, "sentences": ["b"]}}, "inputs.source_sentence", 422),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"], "other": 1}}, "inputs.other", 422),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"top_k": 2}}, "parameters.top_k", 422),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"] * 32}}, "batch size 33", 422),
        ({"inputs": ["a", "b"]}, "inputs", 422),
    ]:
        answer = client.post("/similarity", json=wrong)
        assert answer.status_code == status and field in answer.get_json()["error"], (wrong, answer.get_json())
    wrong_kind = client.post(
        "/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b"]}, "model": "reranker"}
    )
    assert wrong_kind.status_code == 424


def test_tokenize_decode_info_and_health(client):
    (tokens,) = client.post("/tokenize", json={"inputs": "hello world", "model": "embedder"}).get_json()
    assert [t["text"] for t in tokens] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    bare = client.post("/tokenize", json={"inputs": ["hello"], "model": "embedder", "add_special_tokens": False})
    assert [t["id"] for t in bare.get_json()[0]] == [7592]
    decoded = client.post("/decode", json={"ids": [[101, 7592, 102]], "model": "embedder"}).get_json()
    assert decoded == ["hello"]
    outside = client.post("/decode", json={"ids": [10**7], "model": "embedder"})
    assert outside.status_code == 422
    info = client.get("/info?model=sentiment").get_json()
    assert info["model_type"] == {
        "classifier": {"id2label": dict(zip("012", LABELS)), "label2id": {label: i for i, label in enumerate(LABELS)}}
    }
    assert info["max_client_batch_size"] == 32 and info["max_input_length"] == 64
    assert (info["model_dtype"], info["max_batch_requests"], info["max_batch_tokens"]) == ("float32", 32, 32 * 64)
    assert client.get("/info?model=embedder").get_json()["model_type"] == {"embedding": {"pooling": "mean"}}
    health = client.get("/health")
    assert (health.status_code, health.get_data()) == (200, b"")


def test_v2_and_v1_serve_classifiers_with_metadata_naming_text_in_scores_out(client):
    metadata = client.get("/v2/models/sentiment").get_json()
    assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]
    assert metadata["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 3]}]
    infer = client.post(
        "/v2/models/reranker/infer",
        json={
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["q", "q"]},
                {"name": "text_pair", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
            ]
        },
    ).get_json()
    tei = client.post("/rerank", json={"query": "q", "texts": ["a", "b"]}).get_json()
    by_index = {r["index"]: r["score"] for r in tei}
    assert infer["outputs"][0]["data"] == pytest.approx([by_index[0], by_index[1]], abs=1e-6)
    top = client.post(
        "/v2/models/sentiment/infer",
        json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
            "outputs": [{"name": "scores", "parameters": {"classification": 1}}],
        },
    ).get_json()
    assert top["outputs"][0]["data"][0].split(":")[-1] in LABELS
    v1 = client.post("/v1/models/sentiment:predict", json={"instances": [{"text": "hi"}]}).get_json()
    assert len(v1["predictions"][0]) == 3


def test_the_generic_predict_route_keeps_its_instances_shape(client):
    answer = client.post("/predict", json={"instances": [[1.0]]})
    assert answer.status_code == 400 and "exactly one served model" in answer.get_json()["error"]
