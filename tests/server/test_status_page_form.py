"""The status page's form and sizes, in process: sizes read as people read them; a model's examples
are the requests its plugin serves (the browser test, test_status_page_browser.py, sends them)."""

from __future__ import annotations

import json
import re

import pytest
from servekit.server.pages.status_page import readable_size
from sklearn_models import fit_regressor


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (999, "999 bytes"),
        (1_407, "1.4 kB"),
        (999_949, "999.9 kB"),
        (999_950, "1.0 MB"),
        (90_868_000, "90.9 MB"),
        (7_200_000_000, "7.2 GB"),
    ],
)
def test_sizes_read_as_people_read_them(count, shown):
    assert readable_size(count) == shown


def test_a_model_that_predicts_offers_predict_and_infer_only(servekit_app, tmp_path):
    fit_regressor(tmp_path / "linear")
    client = servekit_app(tmp_path)
    page = client.get("/", headers={"Accept": "text/html"}).get_data(as_text=True)
    examples = json.loads(re.search(r'<script id="examples" type="application/json">(.*?)</script>', page, re.S)[1])
    assert list(examples["linear"]) == ["/v1/models/linear:predict", "/v2/models/linear/infer"]
    for path, body in examples["linear"].items():
        assert client.post(path, json=body).status_code == 200
    size = re.search(r'<td class="memory">([^<]*)<', page)[1]
    assert size.endswith((" bytes", " kB")), size  # a model of a few hundred bytes was "0.0 MB"
