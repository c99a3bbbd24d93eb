"""/openapi.json covers every route; schemathesis finds no 5xx and no answer off the schema;
the status page and /docs render in headless Chromium (screenshots in the test artifacts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import requests
from chromium_cdp import chromium
from repo_paths import REPO as ROOT
from schemathesis_run import fuzz_operations
from servekit.server.pages.openapi import routes, template_of
from servekit.testing import ServerProcess
from sklearn_models import fit_regressor

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

schemathesis = pytest.importorskip("schemathesis")

ARTIFACTS = Path(os.environ.get("SERVEKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
V1_VERBS = re.compile(r":(predict|classify|regress|explain)$")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("openapi")
    fit_regressor(base / "linear")
    return base


@pytest.fixture(scope="module")
def server(repo):
    with ServerProcess(repo, workers=1, threads=8) as s:
        yield s


# -- the document ------------------------------------------------------------------------------


def test_every_route_of_the_app_is_in_the_document(servekit_app, repo):
    client = servekit_app(repo, request_log_url="off")
    app = client.application
    doc = client.get("/openapi.json").get_json()
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    missing = []
    for rule, methods in routes(app).items():
        for method in methods:
            if "<path:" in rule:
                # one catch-all rule (V1's NAME:verb) must be documented through its expansions
                prefix = template_of(rule).split("{")[0]
                if not any(p.startswith(prefix) and m == method for p, m in documented):
                    missing.append((rule, method))
            elif (template_of(rule), method) not in documented:
                missing.append((rule, method))
    assert not missing
    v1_verbs = {V1_VERBS.search(p).group(1) for p, _ in documented if V1_VERBS.search(p)}
    assert v1_verbs == {"predict", "classify", "regress", "explain"}
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "default" in op["responses"], path  # every error has the Error schema
            for name in re.findall(r"\{(\w+)\}", path):
                assert any(p["name"] == name and p["in"] == "path" for p in op["parameters"]), (path, name)
    assert doc["components"]["schemas"]["ModelName"]["enum"] == ["linear"]


def test_the_document_marks_secured_operations(servekit_app, repo):
    client = servekit_app(repo, api_key="k", request_log_url="off")
    doc = client.get("/openapi.json", headers={"Authorization": "Bearer k"}).get_json()
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert doc["paths"]["/v2/models/{name}/infer"]["post"]["security"] == [{"apiKey": []}]
    assert "security" not in doc["paths"]["/v2/health/ready"]["get"]


# -- schemathesis against the real server --------------------------------------------------------


CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]
EXAMPLES = 12  # per operation: about 650 requests, well under two minutes


def test_schemathesis_finds_no_server_error_and_no_answer_off_the_schema(server):
    loaded = schemathesis.openapi.from_url(server.url + "/openapi.json")
    # load/unload change what is served (an unloaded model answers 503 by design)
    loaded = loaded.exclude(path_regex=r"^/v2/repository/models/")
    operations = [result.ok() for result in loaded.get_all_operations()]
    failures, sent = fuzz_operations(
        operations, lambda case: case.call_and_validate(checks=CHECKS, timeout=30), EXAMPLES
    )
    print(f"\nschemathesis: {len(operations)} operations, {sent} requests, {len(failures)} failing")
    assert len(operations) > 40
    assert not failures, "\n\n".join(failures)


# -- headless Chromium -------------------------------------------------------------------------------


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,1000",
        "--virtual-time-budget=5000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_status_page_in_headless_chromium(server, tmp_path):
    dom = run_chromium(tmp_path, "--dump-dom", server.url + "/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-model="linear"' in html and "AVAILABLE" in html
    assert "<option" in html and "/v1/models/linear:predict" in html  # the form's endpoints, set by its script
    assert "/v2/models/linear/infer" in html
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "status_page.png"
    shot.unlink(missing_ok=True)
    result = run_chromium(tmp_path, f"--screenshot={shot}", server.url + "/")
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    print(f"\nstatus page screenshot: {shot} ({len(data)} bytes)")
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_docs_page_renders_the_document_offline_in_headless_chromium(server, tmp_path):
    dom = run_chromium(tmp_path, "--dump-dom", server.url + "/docs")
    assert dom.returncode == 0, dom.stderr[-2000:]
    main = dom.stdout[dom.stdout.index('<main id="main">') :]
    assert main.startswith('<main id="main"><h1>servekit')  # the script fetched and rendered the document
    assert "<code>/v2/models/{name}/infer</code>" in main and "<code>/v1/models/{name}:predict</code>" in main
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    result = run_chromium(tmp_path, f"--screenshot={ARTIFACTS / 'docs_page.png'}", server.url + "/docs")
    assert result.returncode == 0, result.stderr[-2000:]


def test_status_page_form_sends_a_request(server):
    # what the form's script does: POST the pre-filled example body to the chosen endpoint
    page = requests.get(server.url + "/", headers={"Accept": "text/html"}).text  # as a browser asks
    example = re.search(r'<script id="examples" type="application/json">(.*?)</script>', page, re.S).group(1)
    examples = json.loads(example)
    for path, body in examples["linear"].items():
        r = requests.post(server.url + path, json=body)
        assert r.status_code == 200, (path, r.text)
