"""Autoscaling and KServe runtime manifests: Kubernetes schemas, the KEDA and KServe CRDs, and what they say."""

from __future__ import annotations

import copy
import textwrap

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import is_custom, validate
from repo_paths import REPO as ROOT
from servekit.cli.commands import main as cli
from servekit.scaffold import project as scaffold
from sklearn_models import fit_iris

K8S_VERSION = "1.30.0"


def options(**kw) -> scaffold.BuildOptions:
    return scaffold.BuildOptions(model_name="Iris_Classifier", image="registry.local/iris:1", **kw)


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def check(doc: dict) -> None:
    """The document against its schema: a built-in kind against Kubernetes', a custom one against its CRD's."""
    if is_custom(doc):
        validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def kinds(manifests: dict[str, str], name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in documents(manifests[name])}


# -- every rendered manifest validates --------------------------------------------------


@pytest.mark.parametrize("autoscale", ["", "hpa", "keda"])
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_every_manifest_validates_against_its_schema(autoscale, gpu):
    manifests = scaffold.render_manifests(options(gpu=gpu, autoscale=autoscale, startup_seconds=12.0))
    assert ("prometheus-adapter.yaml" in manifests) is (autoscale == "hpa")
    for text in manifests.values():
        for doc in documents(text):
            check(doc)


def test_the_example_inference_service_validates_and_names_the_runtime():
    doc = yaml.safe_load((ROOT / "examples" / "kserve" / "sklearn-iris.yaml").read_text())
    validate(doc)
    model = doc["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "sklearn"} and model["runtime"] == "servekit"
    runtime = kinds(scaffold.render_manifests(options()), "kserve-runtime.yaml")["ClusterServingRuntime"]
    assert runtime["metadata"]["name"] == "servekit"
    assert {"name": "sklearn", "version": "1", "autoSelect": False} in runtime["spec"]["supportedModelFormats"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


@pytest.mark.parametrize(
    "name, kind, spoil",
    [
        ("kubernetes.yaml", "ScaledObject", lambda d: d["spec"]["triggers"][0].pop("type")),
        ("kubernetes.yaml", "ScaledObject", lambda d: d["spec"].update(maxReplicas=4)),  # KEDA says maxReplicaCount
        ("kubernetes.yaml", "ScaledObject", lambda d: d["spec"].update(minReplicaCount="one")),
        ("kubernetes.yaml", "PodDisruptionBudget", lambda d: d["spec"].update(maxUnavailble=1)),
        ("kserve-runtime.yaml", "ClusterServingRuntime", lambda d: d["spec"].update(protocolVersion=["v2"])),
        ("kserve-runtime.yaml", "ClusterServingRuntime", lambda d: d["spec"]["containers"][0].update(args="--x")),
        ("kserve.yaml", "InferenceService", lambda d: d["spec"]["predictor"].update(scaleMetrc="concurrency")),
    ],
)
def test_the_schemas_refuse_a_broken_manifest(name, kind, spoil):
    doc = copy.deepcopy(kinds(scaffold.render_manifests(options(autoscale="keda")), name)[kind])
    check(doc)
    spoil(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        check(doc)


# -- what the autoscaling manifests say --------------------------------------------------------


def test_keda_scales_on_the_replicas_concurrency_with_a_slow_scale_down():
    docs = kinds(
        scaffold.render_manifests(options(autoscale="keda", min_replicas=2, max_replicas=9)), "kubernetes.yaml"
    )
    assert "HorizontalPodAutoscaler" not in docs  # KEDA owns the HPA it makes
    scaled = docs["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"] == "iris-classifier"
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 9)
    prometheus = next(t for t in scaled["triggers"] if t["type"] == "prometheus")["metadata"]
    assert prometheus["query"] == 'sum(servekit_concurrency_per_replica{pod=~"iris-classifier-.*"})'
    assert prometheus["threshold"] == "16"  # one worker x 16 threads
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_the_hpa_adds_the_custom_metric_and_the_adapter_rule_serves_it():
    manifests = scaffold.render_manifests(options(autoscale="hpa", workers=2, threads=8, target_concurrency=10))
    hpa = kinds(manifests, "kubernetes.yaml")["HorizontalPodAutoscaler"]["spec"]
    by_type = {m["type"]: m for m in hpa["metrics"]}
    assert by_type["Resource"]["resource"]["name"] == "cpu"
    pods = by_type["Pods"]["pods"]
    assert pods["metric"]["name"] == "servekit_concurrency_per_replica"
    assert pods["target"] == {"type": "AverageValue", "averageValue": "10"}
    config = yaml.safe_load(kinds(manifests, "prometheus-adapter.yaml")["ConfigMap"]["data"]["config.yaml"])
    (rule,) = config["rules"]
    assert rule["name"]["as"] == pods["metric"]["name"]
    assert rule["seriesQuery"].startswith("servekit_concurrency_per_replica{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_without_autoscale_the_hpa_stays_on_cpu_and_the_pdb_and_spread_are_there():
    docs = kinds(scaffold.render_manifests(options()), "kubernetes.yaml")
    assert [m["type"] for m in docs["HorizontalPodAutoscaler"]["spec"]["metrics"]] == ["Resource"]
    pdb = docs["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1
    pod = docs["Deployment"]["spec"]["template"]
    assert pdb["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spread = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    assert all(c["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items() for c in spread)
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("seconds, allowed", [(None, 600), (4.0, 75), (100.0, 360), (0.5, 65)])
def test_the_startup_probe_is_sized_from_the_measured_start(seconds, allowed):
    docs = kinds(scaffold.render_manifests(options(startup_seconds=seconds)), "kubernetes.yaml")
    probe = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == allowed


# -- servekit build -----------------------------------------------------------------------------


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "iris"
    fit_iris(folder)
    (folder / "servekit.yaml").write_text(
        textwrap.dedent(
            """\
            warmup: [{v1: {instances: [[5.1, 3.5, 1.4, 0.2]]}}]
            """
        )
    )
    return folder


@pytest.mark.slow
def test_build_measures_the_start_and_writes_the_autoscaling_manifests(model_folder, capsys):
    assert (
        cli(["build", str(model_folder), "--context-only", "--no-wheel", "--autoscale", "hpa", "--max-replicas", "6"])
        == 0
    )
    out = capsys.readouterr().out
    assert "the model loaded and warmed up in" in out
    deploy = model_folder / "deploy"
    assert {p.name for p in deploy.iterdir()} == {
        "kubernetes.yaml",
        "kserve.yaml",
        "kserve-runtime.yaml",
        "prometheus-adapter.yaml",
    }
    docs = kinds({"k": (deploy / "kubernetes.yaml").read_text()}, "k")
    for doc in docs.values():
        check(doc)
    assert docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 6
    probe = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < 600  # measured: well under the default


def test_build_takes_the_startup_seconds_without_measuring(model_folder, capsys):
    argv = [
        "build",
        str(model_folder),
        "--context-only",
        "--no-wheel",
        "--autoscale",
        "keda",
        "--startup-seconds",
        "30",
    ]
    assert cli(argv) == 0
    assert "loaded and warmed up" not in capsys.readouterr().out
    docs = kinds({"k": (model_folder / "deploy" / "kubernetes.yaml").read_text()}, "k")
    assert "ScaledObject" in docs and "HorizontalPodAutoscaler" not in docs
    probe = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 150
    assert not (model_folder / "deploy" / "prometheus-adapter.yaml").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--min-replicas", "5", "--max-replicas", "2"], "expected 0 <= min <= max"),
        (["--target-concurrency", "-1"], "--target-concurrency -1"),
        (["--startup-seconds", "0"], "--startup-seconds 0"),
    ],
)
def test_build_refuses_impossible_scaling_in_one_line(model_folder, capsys, extra, message):
    assert cli(["build", str(model_folder), "--context-only", "--no-wheel", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_start_that_cannot_be_measured_falls_back_to_the_default(tmp_path, capsys):
    folder = tmp_path / "broken"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.joblib").write_bytes(b"not a pickle")
    assert cli(["build", str(folder), "--context-only", "--no-wheel"]) == 0
    assert "could not time the model's start here" in capsys.readouterr().out
    docs = kinds({"k": (folder / "deploy" / "kubernetes.yaml").read_text()}, "k")
    probe = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 600
