"""TF Serving's REST API (V1) end to end, through real gunicorn, on sklearn models."""

from __future__ import annotations

import numpy as np
import pytest
import requests

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
NAMED = [dict(zip(["sepal_length", "sepal_width", "petal_length", "petal_width"], r)) for r in IRIS_ROWS]


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=30)


def test_status_lists_every_version_with_tf_serving_fields(sklearn_server):
    r = requests.get(sklearn_server.url + "/v1/models/iris", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "iris" and body["object"] == "model"
    assert body["model_version_status"] == [
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
    ]


@pytest.mark.parametrize("suffix, version", [("/versions/1", "1"), ("/labels/canary", "2")])
def test_status_of_one_version_or_label(sklearn_server, suffix, version):
    r = requests.get(sklearn_server.url + "/v1/models/iris" + suffix, timeout=10)
    assert r.status_code == 200
    assert [s["version"] for s in r.json()["model_version_status"]] == [version]


def test_metadata_describes_signatures_from_the_estimator(sklearn_server):
    body = requests.get(sklearn_server.url + "/v1/models/iris/versions/1/metadata", timeout=10).json()
    assert body["model_spec"] == {"name": "iris", "signature_name": "", "version": "1"}
    sigs = body["metadata"]["signature_def"]["signature_def"]
    assert set(sigs) >= {"serving_default", "predict_proba", "classification"}
    default = sigs["serving_default"]
    assert list(default["inputs"]) == ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    assert default["inputs"]["sepal_length"]["dtype"] == "DT_DOUBLE"
    assert default["outputs"]["predict"]["dtype"] == "DT_STRING"
    assert default["method_name"] == "tensorflow/serving/predict"


def test_predict_row_and_columnar_formats(sklearn_server):
    r = post(sklearn_server, "/v1/models/iris:predict", {"instances": IRIS_ROWS})
    assert r.status_code == 200 and r.json() == {"predictions": ["setosa", "virginica"]}
    r = post(sklearn_server, "/v1/models/iris:predict", {"instances": NAMED})
    assert r.json() == {"predictions": ["setosa", "virginica"]}
    columns = {k: [row[k] for row in NAMED] for k in NAMED[0]}
    r = post(sklearn_server, "/v1/models/iris:predict", {"inputs": columns})
    assert r.json() == {"outputs": ["setosa", "virginica"]}


def test_predict_on_versions_labels_and_signatures(sklearn_server):
    for path in ("/v1/models/iris/versions/1:predict", "/v1/models/iris/labels/stable:predict"):
        assert post(sklearn_server, path, {"instances": IRIS_ROWS}).json()["predictions"] == ["setosa", "virginica"]
    r = post(sklearn_server, "/v1/models/iris:predict", {"signature_name": "predict_proba", "instances": IRIS_ROWS})
    probabilities = np.array(r.json()["predictions"])
    assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1.0)


def test_classify_and_regress_answer_under_results(sklearn_server):
    r = post(sklearn_server, "/v1/models/iris:classify", {"examples": NAMED})
    results = r.json()["results"]
    assert [max(pairs, key=lambda p: p[1])[0] for pairs in results] == ["setosa", "virginica"]
    assert [label for label, _ in results[0]] == ["setosa", "versicolor", "virginica"]
    # context shared by all examples, as TF Serving's request format allows
    r = post(sklearn_server, "/v1/models/linear:regress", {"examples": [{"x": [1.0, 2.0]}, {"x": [0, 0]}]})
    assert r.status_code == 200
    assert np.allclose(r.json()["results"], [9.0, 1.0])
    r = post(sklearn_server, "/v1/models/linear:regress", {"context": {"x": [1.0, 1.0]}, "examples": [{}]})
    assert np.allclose(r.json()["results"], [6.0])


def test_explain_gives_attributions_per_instance(sklearn_server):
    r = post(sklearn_server, "/v1/models/linear:explain", {"instances": [[1.0, 2.0]]})
    assert r.status_code == 200
    (explanation,) = r.json()["explanations"]
    # exact SHAP values of a linear model against a zero baseline: coef * x
    assert np.allclose(explanation["attributions"], [2.0, 6.0])
    assert np.isclose(explanation["base_values"], 1.0)
    r = post(sklearn_server, "/v1/models/iris:explain", {"instances": IRIS_ROWS[:1]})
    assert np.array(r.json()["explanations"][0]["attributions"]).shape == (3, 4)


def test_generic_paths_need_a_single_model(sklearn_server):
    r = post(sklearn_server, "/predict", {"instances": IRIS_ROWS})
    assert r.status_code == 400 and "exactly one" in r.json()["error"]


def test_the_seed_404_example(sklearn_server):
    r = post(sklearn_server, "/v1/models/half:predict", {"instances": [1.0, 5.0]})
    assert r.status_code == 404
    assert r.headers["Content-Type"] == "application/json"
    assert r.json()["error"].startswith("Servable not found for request: Latest(half); models served here: ")


@pytest.mark.parametrize(
    "path, body, status, fragment",
    [
        ("/v1/models/iris:predict", {"instances": [[1, 2, 3]]}, 400, "4 features"),
        ("/v1/models/iris/versions/9:predict", {"instances": IRIS_ROWS}, 404, "Specific(iris, 9)"),
        ("/v1/models/iris/labels/nope:predict", {"instances": IRIS_ROWS}, 404, "label"),
        ("/v1/models/iris:predict", {"signature_name": "nope", "instances": IRIS_ROWS}, 400, "unknown signature"),
        ("/v1/models/iris:regress", {"examples": NAMED}, 400, "classifier"),
        ("/v1/models/iris:frobnicate", {"instances": IRIS_ROWS}, 400, "Malformed request"),
        ("/v1/models/broken:predict", {"instances": [[1]]}, 503, "failed to load"),
    ],
)
def test_errors_are_json_with_tf_serving_statuses(sklearn_server, path, body, status, fragment):
    r = post(sklearn_server, path, body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]


def test_a_failed_model_is_reported_and_the_others_serve(sklearn_server):
    status = requests.get(sklearn_server.url + "/v1/models/broken", timeout=10).json()
    (entry,) = status["model_version_status"]
    assert entry["state"] == "END" and entry["status"]["error_code"] != "OK"
    assert entry["status"]["error_message"]
    assert "/tmp" not in entry["status"]["error_message"]  # no file paths leak to clients
    assert requests.get(sklearn_server.url + "/v2/health/ready", timeout=10).status_code == 200
    assert post(sklearn_server, "/v1/models/iris:predict", {"instances": IRIS_ROWS}).status_code == 200


def test_nan_and_infinity_tokens_are_accepted(sklearn_server):
    body = b'{"instances": [[NaN, 1.0], [Infinity, -Infinity]]}'
    r = requests.post(sklearn_server.url + "/v1/models/echo:predict", data=body, timeout=10)
    assert r.status_code == 200
    assert r.text == '{"predictions":[[NaN,2.0],[Infinity,-Infinity]]}'


def test_a_model_that_raises_answers_500_and_the_worker_lives_on(sklearn_server):
    r = post(sklearn_server, "/v1/models/echo:predict", {"instances": [1], "parameters": {"fail": True}})
    assert r.status_code == 500
    assert "asked to fail" in r.json()["error"]
    assert post(sklearn_server, "/v1/models/echo:predict", {"instances": [1]}).json() == {"predictions": [2]}


def test_b64_in_and_out(sklearn_server):
    r = post(sklearn_server, "/v1/models/echo:predict", {"inputs": {"img_bytes": [{"b64": "AAE="}]}})
    assert r.json() == {"outputs": [{"b64": "AAE="}]}
    r = post(sklearn_server, "/v1/models/echo:predict", {"instances": ["hello"]})
    assert r.json() == {"predictions": ["hello"]}


# -- fields: each read, or refused naming it ----------------------------------------------

V1_BODIES = {
    "/v1/models/iris:predict": {"instances": IRIS_ROWS},
    "/v1/models/iris:explain": {"instances": IRIS_ROWS},
    "/v1/models/iris:classify": {"examples": NAMED},
    "/v1/models/linear:regress": {"examples": [{"x": [1.0, 2.0]}]},
    "/predict": {"instances": IRIS_ROWS},
    "/explain": {"instances": IRIS_ROWS},
}


@pytest.mark.parametrize("path", sorted(V1_BODIES))
@pytest.mark.parametrize("field", ["model_spec", "signature", "output_filter", "instance"])
def test_a_field_tf_serving_does_not_define_is_a_400_naming_it(sklearn_server, path, field):
    """TF Serving's REST bodies are ``signature_name`` with ``instances`` or ``inputs``
    (``context`` and ``examples`` for classify and regress); servekit adds ``parameters``
    and ``stream``.  A misspelt or gRPC-only field would otherwise be answered as if not sent."""
    r = post(sklearn_server, path, {**V1_BODIES[path], field: "x"})
    assert r.status_code == 400, r.text
    assert f"does not take the field {field!r}" in r.json()["error"]


# -- versions: one answer per route ---------------------------------------------------------

V1_VERSION_ROUTES = [
    ("GET", "/v1/models/iris/versions/{}"),
    ("GET", "/v1/models/iris/versions/{}/metadata"),
    ("POST", "/v1/models/iris/versions/{}:predict"),
    ("POST", "/v1/models/iris/versions/{}:classify"),
    ("POST", "/v1/models/iris/versions/{}:regress"),
    ("POST", "/v1/models/iris/versions/{}:explain"),
]
V2_VERSION_ROUTES = [
    ("GET", "/v2/models/iris/versions/{}"),
    ("GET", "/v2/models/iris/versions/{}/ready"),
    ("GET", "/v2/models/iris/versions/{}/config"),
    ("GET", "/v2/models/iris/versions/{}/stats"),
    ("POST", "/v2/models/iris/versions/{}/infer"),
    ("POST", "/v2/models/iris/versions/{}/explain"),
    ("POST", "/v2/models/iris/versions/{}/generate"),
    ("POST", "/v2/models/iris/versions/{}/generate_stream"),
]


def answers(server, routes, version):
    """Each route's status and error for ``version``, the body being one every route could take."""
    found = {}
    for method, template in routes:
        path = template.format(version)
        r = requests.request(method, server.url + path, json={"instances": IRIS_ROWS}, timeout=10)
        found[path] = (r.status_code, r.json().get("error", ""))
    return found


@pytest.mark.parametrize("version", ["abc", "-1", "1.5", "..%2F1", "%C2%B9"])
def test_a_malformed_version_is_tf_servings_400_on_every_v1_route(sklearn_server, version):
    """TF Serving's path patterns take a version of digits; any other path is its
    ``Malformed request: METHOD PATH`` (InvalidArgument, 400)."""
    for path, (status, error) in answers(sklearn_server, V1_VERSION_ROUTES, version).items():
        assert status == 400, (path, status, error)
        assert error.startswith("Malformed request: "), (path, error)


@pytest.mark.parametrize("version", ["abc", "-1", "1.5", "%C2%B9"])
def test_a_malformed_version_is_one_400_on_every_v2_route(sklearn_server, version):
    found = answers(sklearn_server, V2_VERSION_ROUTES, version)
    for path, (status, error) in found.items():
        assert status == 400, (path, status, error)
        assert error.startswith("failed to get model version from specified version string"), (path, error)


@pytest.mark.parametrize("routes", [V1_VERSION_ROUTES, V2_VERSION_ROUTES], ids=["v1", "v2"])
@pytest.mark.parametrize("version", ["0", "9", "99999999999999999999999"])
def test_a_version_no_model_has_is_404_on_every_route(sklearn_server, routes, version):
    for path, (status, error) in answers(sklearn_server, routes, version).items():
        assert status == 404, (path, status, error)
