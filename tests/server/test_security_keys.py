"""API keys with scopes: infer, admin, metrics; from --api-key, --api-key-file and the environment.

401 without a key, 403 with a key of the wrong scope, on HTTP (Flask and the
fast lane) and gRPC alike; a key file is read again when it changes; hashed keys
(``sha256:<hex>``) work; keys never reach the log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time

import grpc
import pytest
from grpc_support import ECHO_MODEL
from hardening_models import hardening_repo
from servekit.errors import Forbidden, Unauthorized
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc
from servekit.server.app import build_dataplane
from servekit.server.auth import ApiKey, parse_keys, scope_of
from servekit.server.grpc_server import build_server
from servekit.server.settings import Settings

INFER, ADMIN, METRICS, ALL = "infer-key-1", "admin-key-2", "metrics-key-3", "all-key-4"
KEY_FILE = f"""
# scopes key
infer {INFER}
admin sha256:{hashlib.sha256(ADMIN.encode()).hexdigest()}
metrics {METRICS}
* {ALL}
"""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("path", "scope"),
    [
        ("/v2/models/m/infer", "infer"),
        ("/v1/models/m:predict", "infer"),
        ("/v2/models/m", "infer"),
        ("/v2/repository/index", "admin"),
        ("/v2/repository/models/m/load", "admin"),
        ("/v1/logs/requests/abc", "admin"),
        ("/metrics", "metrics"),
        ("/monitoring/prometheus/metrics", "metrics"),
    ],
)
def test_each_path_has_its_scope(path, scope):
    assert scope_of(path) == scope


def test_key_lines_are_parsed_and_bad_ones_named():
    keys = parse_keys("infer,metrics abc\n  # comment\n* def", "f")
    assert [sorted(s) for s, _ in keys] == [["infer", "metrics"], ["admin", "infer", "metrics"]]
    with pytest.raises(ValueError, match="line 1: unknown scope"):
        parse_keys("root abc", "f")
    with pytest.raises(ValueError, match="line 2: expected 'SCOPES KEY'"):
        parse_keys("infer a\ninfer", "f")


def test_scopes_401_and_403(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEY_FILE)
    keys = ApiKey(key_file=str(path))
    keys.check("/v2/models/m/infer", f"Bearer {INFER}")
    keys.check("/v2/repository/index", f"Bearer {ADMIN}")  # hashed in the file
    keys.check("/v2/repository/index", f"bearer {ALL}")
    with pytest.raises(Unauthorized):
        keys.check("/v2/models/m/infer", None)
    with pytest.raises(Unauthorized):
        keys.check("/v2/models/m/infer", "Bearer nope")
    with pytest.raises(Forbidden, match="'admin' scope"):
        keys.check("/v2/repository/index", f"Bearer {INFER}")
    with pytest.raises(Forbidden, match="'infer' scope"):
        keys.check("/v2/models/m/infer", f"Bearer {METRICS}")
    # a metrics-scoped key exists: /metrics is no longer open
    with pytest.raises(Unauthorized):
        keys.check("/metrics", None)
    keys.check("/metrics", f"Bearer {METRICS}")
    keys.check("/v2/health/ready", None)


def test_the_single_api_key_has_every_scope_and_leaves_metrics_open():
    keys = ApiKey("solo")
    for path in ("/v2/models/m/infer", "/v2/repository/index", "/v1/logs/requests/x"):
        keys.check(path, "Bearer solo")
    keys.check("/metrics", None)


def test_keys_from_the_environment():
    keys = ApiKey.from_settings(Settings(), {"SERVEKIT_API_KEYS": "infer a1;admin b2"})
    assert keys is not None
    keys.check("/v2/models/m/infer", "Bearer a1")
    with pytest.raises(Forbidden):
        keys.check("/v2/models/m/infer", "Bearer b2")
    assert ApiKey.from_settings(Settings(), {}) is None


def test_the_key_file_is_read_again_when_it_changes(tmp_path, monkeypatch):
    import servekit.server.auth as auth

    monkeypatch.setattr(auth, "_RECHECK_SECONDS", 0.0)
    path = tmp_path / "keys"
    path.write_text("infer old-key\n")
    keys = ApiKey(key_file=str(path))
    keys.check("/v2/models/m/infer", "Bearer old-key")
    path.write_text("infer new-key-rotated\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    keys.check("/v2/models/m/infer", "Bearer new-key-rotated")
    with pytest.raises(Unauthorized):
        keys.check("/v2/models/m/infer", "Bearer old-key")
    path.write_text("root broken\n")  # a bad file keeps the keys read last
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    keys.check("/v2/models/m/infer", "Bearer new-key-rotated")


# -- through the app ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return hardening_repo(tmp_path_factory.mktemp("keys"))


@pytest.mark.parametrize("fast_lane", [True, False])
def test_http_scopes_through_the_app(servekit_app, repo, tmp_path, caplog, fast_lane):
    path = tmp_path / "keys"
    path.write_text(KEY_FILE)
    client = servekit_app(
        repo, api_key_file=str(path), model_control_mode="explicit", request_log_url="off", fast_lane=fast_lane
    )
    body = {"instances": [[1.0, 2.0]]}
    caplog.set_level(logging.DEBUG)
    assert client.post("/v1/models/linear:predict", json=body).status_code == 401
    assert client.post("/v1/models/linear:predict", json=body, headers=bearer(INFER)).status_code == 200
    r = client.post("/v1/models/linear:predict", json=body, headers=bearer(ADMIN))
    assert r.status_code == 403 and "'infer' scope" in r.get_json()["error"]
    assert client.post("/v2/repository/index", headers=bearer(INFER)).status_code == 403
    assert client.post("/v2/repository/index", headers=bearer(ADMIN)).status_code == 200
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(METRICS)).status_code == 200
    assert client.get("/v2/health/live").status_code == 200
    assert not any(k in caplog.text for k in (INFER, ADMIN, METRICS, ALL))


@pytest.mark.slow
def test_grpc_scopes(tmp_path):
    models = tmp_path / "models"
    (models / "echo" / "1").mkdir(parents=True)
    (models / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    keys = tmp_path / "keys"
    keys.write_text(KEY_FILE)
    dp = build_dataplane(Settings(paths=[str(models)], poll_interval=0))
    dp.repository.load_now()
    settings = Settings(host="127.0.0.1", grpc_port=0, api_key_file=str(keys), model_control_mode="explicit")
    server, port = build_server(dp, settings)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = v2_grpc.GRPCInferenceServiceStub(channel)
            meta = v2.ModelMetadataRequest(name="echo")

            def code(call, request, key=None):
                md = [("authorization", f"Bearer {key}")] if key else None
                try:
                    call(request, metadata=md, timeout=30)
                except grpc.RpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            assert code(stub.ModelMetadata, meta) == grpc.StatusCode.UNAUTHENTICATED
            assert code(stub.ModelMetadata, meta, INFER) == grpc.StatusCode.OK
            assert code(stub.ModelMetadata, meta, ADMIN) == grpc.StatusCode.PERMISSION_DENIED
            index = v2.RepositoryIndexRequest()
            assert code(stub.RepositoryIndex, index, INFER) == grpc.StatusCode.PERMISSION_DENIED
            assert code(stub.RepositoryIndex, index, ADMIN) == grpc.StatusCode.OK
            assert code(stub.ServerLive, v2.ServerLiveRequest()) == grpc.StatusCode.OK
    finally:
        server.stop(None)
        dp.repository.stop()
