"""Retrieval through the clients people already use: one server with an embedder, a
cross-encoder and a classifier, asked by huggingface_hub's InferenceClient, LangChain's
HuggingFaceEndpointEmbeddings, the cohere SDK and raw TEI and vLLM bodies; the answers
equal sentence-transformers' and transformers' own on the same folders."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import requests
from generative_models import minilm_folder
from retrieval_models import LABELS, build_cross_encoder_folder, build_sequence_classifier
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow

QUERY = "what is deep learning"
PASSAGES = ["deep learning is a kind of machine learning", "cheese is made from milk", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval")
    models = root / "models"
    models.mkdir()
    build_cross_encoder_folder(models / "reranker", root)
    build_sequence_classifier(models / "sentiment", LABELS, seed=1)
    shutil.copytree(minilm_folder(), models / "embedder")
    return models


@pytest.fixture(scope="module")
def server(folders):
    with ServerProcess(folders) as process:
        yield process


def test_tei_rerank_scores_equal_cross_encoders_sorted_best_first(server, folders):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(folders / "reranker"), device="cpu").predict([(QUERY, p) for p in PASSAGES])
    response = requests.post(f"{server.url}/rerank", json={"query": QUERY, "texts": PASSAGES, "return_text": True})
    assert response.status_code == 200, response.text
    ranks = response.json()
    assert [r["index"] for r in ranks] == list(np.argsort(-expected))
    for rank in ranks:
        assert rank["score"] == pytest.approx(float(expected[rank["index"]]), abs=1e-4)
        assert rank["text"] == PASSAGES[rank["index"]]


def test_cohere_sdk_rerank_and_vllm_bodies_agree_with_cross_encoder(server, folders):
    import cohere
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(folders / "reranker"), device="cpu").predict([(QUERY, p) for p in PASSAGES])
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    reranked = client.rerank(model="reranker", query=QUERY, documents=PASSAGES, top_n=2)
    assert [r.index for r in reranked.results] == list(np.argsort(-expected)[:2])
    for result in reranked.results:
        assert result.relevance_score == pytest.approx(float(expected[result.index]), abs=1e-4)

    body = {"model": "reranker", "query": QUERY, "documents": PASSAGES, "top_n": 1, "return_documents": True}
    jina = requests.post(f"{server.url}/v1/rerank", json=body).json()
    (best,) = jina["results"]
    assert best["document"] == {"text": PASSAGES[int(np.argmax(expected))]}
    assert jina["usage"]["total_tokens"] > 0

    score = requests.post(f"{server.url}/score", json={"model": "reranker", "text_1": QUERY, "text_2": PASSAGES})
    assert [d["score"] for d in score.json()["data"]] == pytest.approx([float(s) for s in expected], abs=1e-4)


def test_classifier_labels_and_probabilities_equal_transformers_pipeline(server, folders):
    from huggingface_hub import InferenceClient
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(folders / "sentiment"), top_k=None, device="cpu")
    expected = {p["label"]: p["score"] for p in classify(["I like this a lot"])[0]}
    client = InferenceClient(model=f"{server.url}/predict")
    # TEI answers one text with a flat list, best first; the hub client reads its first element
    top = client.text_classification("I like this a lot")
    assert top.label == max(expected, key=expected.get)
    assert top.score == pytest.approx(expected[top.label], abs=1e-4)
    assert set(expected) == set(LABELS)

    raw = requests.post(f"{server.url}/predict", json={"inputs": [["I like this a lot"], ["a", "b"]]}).json()
    assert {p["label"]: p["score"] for p in raw[0]} == pytest.approx(expected, abs=1e-4)
    pair = {p["label"]: p["score"] for p in classify([{"text": "a", "text_pair": "b"}])[0]}
    assert {p["label"]: p["score"] for p in raw[1]} == pytest.approx(pair, abs=1e-4)


def test_embeddings_equal_sentence_transformer_through_the_hub_client(server, folders):
    from huggingface_hub import InferenceClient
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(folders / "embedder"), device="cpu").encode(PASSAGES)
    hub = np.asarray(InferenceClient(model=f"{server.url}/embed").feature_extraction(PASSAGES))
    assert hub.shape == expected.shape
    for got, want in zip(hub, expected):
        assert float(np.dot(got, want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.9999


def test_sentence_similarity_equals_sentence_transformers_through_the_hub_client(server, folders):
    from huggingface_hub import InferenceClient
    from sentence_transformers import SentenceTransformer, util

    model = SentenceTransformer(str(folders / "embedder"), device="cpu")
    expected = util.cos_sim(model.encode(PASSAGES[:1]), model.encode(PASSAGES[1:]))[0].tolist()
    hub = InferenceClient(model=f"{server.url}/similarity").sentence_similarity(PASSAGES[0], PASSAGES[1:])
    assert hub == pytest.approx(expected, abs=1e-4)


def test_langchain_huggingface_endpoint_embeddings_talk_to_servekit(server, folders):
    # langchain-huggingface pins huggingface-hub<2, which transformers 5 refuses: not in the
    # test extra; scripts/test.sh installs it with --no-deps (it runs on hub 2)
    pytest.importorskip("langchain_huggingface")
    from huggingface_hub import InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(folders / "embedder"), device="cpu").encode(PASSAGES)
    langchain = HuggingFaceEndpointEmbeddings(model="servekit/embedder")
    # LangChain takes a hub repo id only; its client is pointed at servekit's TEI route instead
    langchain.client = InferenceClient(model=f"{server.url}/embed")
    vectors = np.asarray(langchain.embed_documents(PASSAGES))
    query = np.asarray(langchain.embed_query(PASSAGES[0]))
    for got, want in zip([query, *vectors], [expected[0], *expected]):
        assert float(np.dot(got, want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.9999


def test_bad_requests_answer_the_original_apis_4xx_and_the_server_keeps_serving(server):
    url = server.url
    empty = requests.post(f"{url}/rerank", json={"query": "q", "texts": []})
    assert (empty.status_code, empty.json()["error_type"]) == (400, "empty")
    too_many = requests.post(f"{url}/rerank", json={"query": "q", "texts": ["a"] * 33})
    assert (too_many.status_code, too_many.json()["error_type"]) == (422, "validation")
    too_long = requests.post(f"{url}/rerank", json={"query": "word " * 100, "texts": ["a"], "truncate": False})
    assert (too_long.status_code, too_long.json()["error_type"]) == (422, "validation")
    assert "tokens" in too_long.json()["error"]
    cut = requests.post(f"{url}/rerank", json={"query": "word " * 100, "texts": ["a"], "truncate": True})
    assert cut.status_code == 200
    to_embedder = requests.post(f"{url}/rerank", json={"model": "embedder", "query": "q", "texts": ["a"]})
    assert (to_embedder.status_code, to_embedder.json()["error_type"]) == (424, "backend")
    unknown = requests.post(
        f"{url}/v2/rerank", json={"model": "reranker", "query": "q", "documents": ["a"], "rank_fields": ["x"]}
    )
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "rank_fields"
    no_docs = requests.post(f"{url}/v2/rerank", json={"model": "reranker", "query": "q", "documents": []})
    assert no_docs.status_code == 400
    assert requests.get(f"{url}/health").status_code == 200
    assert requests.post(f"{url}/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200
