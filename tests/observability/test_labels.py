"""The metric labels come from the one route table (servekit.routes), paths spelled nowhere else."""

from __future__ import annotations

import ast
import inspect

import pytest
from servekit import routes
from servekit.observability import labels


@pytest.mark.parametrize(
    "path, protocol",
    [
        ("/v2/health/ready", "health"),
        ("/v2", "v2"),
        ("/v2/models/m/versions/1/infer", "v2"),
        ("/v2/repository/index", "v2"),
        ("/v1/models", "openai"),  # OpenAI's model list, before TF Serving's /v1/models/NAME
        ("/v1/chat/completions", "openai"),
        ("/openai/v1/embeddings", "openai"),
        ("/models/m", "openai"),
        ("/v1/models/m:predict", "v1"),
        ("/v1/logs/requests", "logs"),
        ("/predict", "generic"),
        ("/explain", "generic"),
        ("/metrics", "metrics"),
        ("/metrics/summary", "metrics"),
        ("/", "ui"),
        ("/openapi.json", "ui"),
        ("/monitoring/prometheus/metrics", "other"),
        ("/nowhere", "other"),
    ],
)
def test_each_path_gets_the_label_of_the_first_route_family_that_holds_it(path, protocol):
    assert labels.protocol_of(path) == protocol


def test_the_labels_spell_no_path_of_their_own():
    """The route table is the only copy: labels.py holds no path literal, and reads every family."""
    tree = ast.parse(inspect.getsource(labels))
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in literals if s.startswith("/") and s != "/"]  # "/" alone: a separator
    assert {label for _, _, label in labels._FAMILIES} == {f.label for f in routes.PROTOCOLS} >= labels.INFERENCE


def test_only_served_models_become_label_values():
    served = {"m"}
    assert [labels.model_of(p, served) for p in ("/v1/models/m:predict", "/v2/models/m/infer")] == ["m", "m"]
    assert labels.model_of("/v2/models/random/infer", served) == ""
    assert labels.model_of("/predict", served) == ""
