"""Validate custom resources (KEDA, KServe) against their CRDs' schemas, as strictly as the API server.

The CRDs under ``tests/data/crds/`` are the projects' own (tests/data/README.md
names source and version).  Their ``openAPIV3Schema`` is JSON Schema with
Kubernetes extensions; this turns it into plain JSON Schema the way the API
server reads it with field validation ``Strict``: a field the schema does not
declare is an error unless ``x-kubernetes-preserve-unknown-fields`` allows it,
``x-kubernetes-int-or-string`` takes either, and ``metadata`` is checked as
object metadata (a DNS name, string labels and annotations).
"""

from __future__ import annotations

import functools
import gzip
from typing import Any

import jsonschema
import yaml
from repo_paths import DATA

CRDS = DATA / "crds"
FILES = {
    ("keda.sh", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("serving.kserve.io", "ClusterServingRuntime"): "serving.kserve.io_clusterservingruntimes.yaml.gz",
    ("serving.kserve.io", "InferenceService"): "serving.kserve.io_inferenceservices.yaml.gz",
}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@functools.cache
def schema_of(api_version: str, kind: str) -> dict[str, Any]:
    group, _, version = api_version.partition("/")
    name = FILES.get((group, kind))
    if name is None:
        raise LookupError(f"no CRD kept for {kind} in {group}")
    path = CRDS / name
    text = gzip.decompress(path.read_bytes()).decode() if name.endswith(".gz") else path.read_text()
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # megabytes of YAML
    assert crd["spec"]["names"]["kind"] == kind and crd["spec"]["group"] == group
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served.get("served", True):
            schema = _strict(served["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = METADATA
            schema["properties"]["apiVersion"] = {"const": api_version}
            schema["properties"]["kind"] = {"const": kind}
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
            return schema
    raise LookupError(f"the {kind} CRD serves no version {version}")


@functools.cache
def _validator(api_version: str, kind: str) -> Any:
    schema = schema_of(api_version, kind)
    # the CRDs' schemas are served by real API servers: not checked against the metaschema
    # here, which takes a minute for the InferenceService's megabytes
    return jsonschema.validators.validator_for(schema)(schema)


def validate(doc: dict[str, Any]) -> None:
    """Raise :class:`jsonschema.ValidationError` where ``doc`` breaks its CRD's schema."""
    error = jsonschema.exceptions.best_match(_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc))
    if error is not None:
        raise error


def is_custom(doc: dict[str, Any]) -> bool:
    return (doc["apiVersion"].partition("/")[0], doc["kind"]) in FILES
