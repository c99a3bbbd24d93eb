"""The deployment templates take TLS files and API keys from Kubernetes Secrets.

A ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``, ``ca.crt``) is mounted
read-only and named by ``SERVEKIT_TLS_*``; an API key Secret by
``SERVEKIT_API_KEY_FILE``; the probes follow (HTTPS, or the port alone under
mutual TLS, where the kubelet has no client certificate).
"""

from __future__ import annotations

import pytest
import yaml
from servekit.scaffold import project as scaffold
from servekit.server.settings import Settings, env_name

kubernetes_validate = pytest.importorskip("kubernetes_validate")
K8S_VERSION = "1.30.0"


def deployment(**kw):
    options = scaffold.BuildOptions(model_name="iris", image="registry.local/iris:1", **kw)
    docs = list(yaml.safe_load_all(scaffold.render_manifests(options)["kubernetes.yaml"]))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return docs


@pytest.mark.parametrize("mutual", [False, True])
def test_tls_and_keys_come_from_secrets(mutual):
    docs = deployment(tls_secret="iris-tls", tls_client_ca=mutual, api_keys_secret="iris-keys")
    pod = docs[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SERVEKIT_TLS_CERT"] == "/etc/servekit/tls/tls.crt"
    assert env["SERVEKIT_TLS_KEY"] == "/etc/servekit/tls/tls.key"
    assert ("SERVEKIT_TLS_CLIENT_CA" in env) is mutual
    assert env["SERVEKIT_API_KEY_FILE"] == "/etc/servekit/keys/api-keys"
    known = {env_name(name) for name in Settings.__dataclass_fields__}
    assert {k for k in env if k.startswith("SERVEKIT_")} <= known  # every name is one servekit reads
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"]}
    assert secrets == {"tls": "iris-tls", "api-keys": "iris-keys"}
    assert all(m["readOnly"] for m in container["volumeMounts"])
    assert pod["securityContext"]["fsGroup"] == 10001
    probe = container["readinessProbe"]
    if mutual:
        assert "tcpSocket" in probe
    else:
        assert probe["httpGet"]["scheme"] == "HTTPS"
    grpc_port = next(p for p in docs[1]["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] == "https"


def test_without_secrets_nothing_changes():
    pod = deployment()[0]["spec"]["template"]["spec"]
    assert "volumes" not in pod
    assert not any(e["name"].startswith("SERVEKIT_TLS") for e in pod["containers"][0]["env"])
    assert "scheme" not in pod["containers"][0]["readinessProbe"]["httpGet"]


def test_the_image_health_check_speaks_tls_when_configured():
    text = scaffold.render_dockerfile(scaffold.BuildOptions(model_name="iris"))
    check = text.split("HEALTHCHECK", 1)[1]
    assert "SERVEKIT_TLS_CERT" in check and "SERVEKIT_TLS_CLIENT_CA" in check
