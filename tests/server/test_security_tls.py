"""TLS end to end with real clients: tritonclient (HTTP and gRPC), tensorflow-serving-api, openai, curl.

Certificates are made in the test (``trustme``): one CA signs the server's
certificate and a client's; a second CA signs a stranger's.  Mutual TLS must
refuse a client without a certificate and one signed by the other CA, on HTTP
(both engines) and gRPC.  Certificates rotate: a new pair written over the
files is served without a restart.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_support import ECHO_MODEL
from servekit.testing import ServerProcess

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.slow  # real servers on real ports


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client, stranger = ca.issue_cert("client@example"), other.issue_cert("stranger@example")
    files = {"ca": ca.cert_pem, "other_ca": other.cert_pem}
    files["cert"], files["key"] = server.cert_chain_pems[0], server.private_key_pem
    files["client_cert"], files["client_key"] = client.cert_chain_pems[0], client.private_key_pem
    files["stranger_cert"], files["stranger_key"] = stranger.cert_chain_pems[0], stranger.private_key_pem
    paths = {}
    for name, blob in files.items():
        paths[name] = folder / f"{name}.pem"
        blob.write_to_path(str(paths[name]))
    paths["ca_obj"] = ca
    return paths


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("tls_models")
    (base / "echo" / "1").mkdir(parents=True)
    (base / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    return base


def client_context(pki, cert: str | None = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        context.load_cert_chain(str(pki[f"{cert}_cert"]), str(pki[f"{cert}_key"]))
    return context


@pytest.fixture(scope="module")
def tls_server(models, pki):
    """gunicorn over TLS (no client certificates), gRPC beside it."""
    with ServerProcess(
        models, grpc_port="auto", tls_cert=pki["cert"], tls_key=pki["key"], client_ssl=client_context(pki, None)
    ) as server:
        yield server


def _curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True, timeout=60)


# -- one-way TLS, every client -------------------------------------------------------------


def test_tritonclient_http_over_tls(tls_server, pki):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{tls_server.http_port}", ssl=True, ssl_options={"ca_certs": str(pki["ca"])}
    )
    assert client.is_server_ready()
    x = httpclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32))
    result = client.infer("echo", [x])
    assert result.as_numpy("x").tolist() == [1.5, 2.5]


def test_tritonclient_grpc_over_tls_with_the_ca(tls_server, pki):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(
        f"127.0.0.1:{tls_server.grpc_port}", ssl=True, root_certificates=str(pki["ca"])
    )
    assert client.is_server_live()
    x = grpcclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    assert client.infer("echo", [x]).as_numpy("x").tolist() == [1.0, 2.0]


def test_tensorflow_serving_api_over_a_secure_channel(tls_server, pki):
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{tls_server.grpc_port}", credentials) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "echo"
        request.inputs["x"].CopyFrom(_tf_tensor([3.0, 4.0]))
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert list(response.outputs["x"].float_val) == [3.0, 4.0]


def _tf_tensor(values):
    from tensorflow.core.framework import tensor_pb2, types_pb2

    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=values)
    proto.tensor_shape.dim.add(size=len(values))
    return proto


def test_a_plain_grpc_channel_is_refused(tls_server):
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{tls_server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            v2_grpc.GRPCInferenceServiceStub(channel).ServerLive(v2.ServerLiveRequest(), timeout=5)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_openai_client_with_an_https_base_url(tls_server, pki):
    openai = pytest.importorskip("openai")

    client = openai.OpenAI(
        base_url=tls_server.url + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=client_context(pki, None)),
    )
    assert "echo" in [m.id for m in client.models.list()]


def test_curl_over_tls(tls_server, pki):
    ok = _curl("--cacert", str(pki["ca"]), tls_server.url + "/v2/health/ready", "-o", "/dev/null", "-w", "%{http_code}")
    assert ok.stdout == "200", ok.stderr
    refused = _curl(tls_server.url + "/v2/health/ready")  # the system's CAs do not know ours
    assert refused.returncode != 0


# -- mutual TLS, both engines -----------------------------------------------------------------


@pytest.fixture(scope="module", params=["gunicorn", "granian"])
def mtls_server(request, models, pki):
    if request.param == "granian":
        pytest.importorskip("granian")
    with ServerProcess(
        models,
        server=request.param,
        grpc_port="auto",
        tls_cert=pki["cert"],
        tls_key=pki["key"],
        tls_client_ca=pki["ca"],
        client_ssl=client_context(pki),
    ) as server:
        yield server


def _curl_status(server, pki, cert: str | None) -> str:
    args = ["--cacert", str(pki["ca"]), "-o", "/dev/null", "-w", "%{http_code}"]
    if cert:
        args += ["--cert", str(pki[f"{cert}_cert"]), "--key", str(pki[f"{cert}_key"])]
    return _curl(*args, server.url + "/v2/health/ready").stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_mutual_tls_over_http(mtls_server, pki):
    assert _curl_status(mtls_server, pki, "client") == "200"
    assert _curl_status(mtls_server, pki, None) != "200"  # no certificate: the handshake fails
    assert _curl_status(mtls_server, pki, "stranger") != "200"  # signed by another CA


def _grpc_live(server, pki, cert: str | None) -> bool:
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc

    kwargs = {"root_certificates": pki["ca"].read_bytes()}
    if cert:
        kwargs.update(private_key=pki[f"{cert}_key"].read_bytes(), certificate_chain=pki[f"{cert}_cert"].read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", grpc.ssl_channel_credentials(**kwargs)) as channel:
        try:
            return v2_grpc.GRPCInferenceServiceStub(channel).ServerLive(v2.ServerLiveRequest(), timeout=5).live
        except grpc.RpcError:
            return False


def test_mutual_tls_over_grpc(mtls_server, pki):
    assert _grpc_live(mtls_server, pki, "client")
    assert not _grpc_live(mtls_server, pki, None)
    assert not _grpc_live(mtls_server, pki, "stranger")


# -- rotation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["gunicorn", "granian"])
def test_a_rotated_certificate_is_served_without_a_restart(models, pki, tmp_path, engine):
    import time

    if engine == "granian":
        pytest.importorskip("granian")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(pki["cert"], cert)
    shutil.copy(pki["key"], key)
    with ServerProcess(
        models, server=engine, grpc_port="auto", tls_cert=cert, tls_key=key, client_ssl=client_context(pki, None)
    ) as server:
        first = ssl.get_server_certificate(("127.0.0.1", server.http_port))
        fresh = pki["ca_obj"].issue_cert("127.0.0.1", "rotated.example")
        fresh.private_key_pem.write_to_path(str(key))
        fresh.cert_chain_pems[0].write_to_path(str(cert))
        deadline = time.monotonic() + 60  # granian respawns its workers, which load their models again
        while _served(server.http_port) in (first, None):
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.5)
        assert _grpc_cert(server) == fresh.cert_chain_pems[0].bytes().decode().strip()


def _served(port: int) -> str | None:
    try:
        return ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
    except OSError:  # a worker between its old and new self
        return None


def _grpc_cert(server) -> str:
    import time

    deadline = time.monotonic() + 60
    while True:
        got = (_served(server.grpc_port) or "").strip()
        if (got and "rotated" in _subject(got)) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _subject(pem: str) -> str:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.encode())
    return " ".join(str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)


# -- servekit tfserving --ssl_config_file ---------------------------------------------------------


def _ssl_config(pki, tmp_path, client_verify: bool) -> str:
    import json

    text = "\n".join(
        [
            f"server_key: {json.dumps(pki['key'].read_text())}",
            f"server_cert: {json.dumps(pki['cert'].read_text())}",
            f"custom_ca: {json.dumps(pki['ca'].read_text())}",
            f"client_verify: {'true' if client_verify else 'false'}",
        ]
    )
    path = tmp_path / "ssl_config.txt"
    path.write_text(text)
    return str(path)


def test_ssl_config_file_maps_to_grpc_tls(pki, tmp_path, models):
    from servekit.cli import tfserving as tfserving_cli

    flags = tfserving_cli.parse_flags(
        [f"--ssl_config_file={_ssl_config(pki, tmp_path, True)}", f"--model_base_path={models / 'echo'}"]
    )
    settings, _ = tfserving_cli.build(flags)
    assert settings.tls_scope == "grpc"
    assert Path(settings.tls_cert).read_text() == pki["cert"].read_text()
    assert Path(settings.tls_client_ca).read_text() == pki["ca"].read_text()


def test_a_broken_ssl_config_file_is_refused_by_name(tmp_path, capsys):
    from servekit.cli import tfserving as tfserving_cli

    path = tmp_path / "bad.txt"
    path.write_text('server_key: "k"\nno_such_field: 1\n')
    assert tfserving_cli.main([f"--ssl_config_file={path}", "--model_base_path=/nonexistent"]) == 2
    assert "--ssl_config_file" in capsys.readouterr().err


def test_tfserving_grpc_with_ssl_config_file_and_client_verify(pki, tmp_path, models):
    from servekit.testing import free_port
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    server = ServerProcess(models / "echo", grpc_port=free_port())
    server.command = lambda: [  # type: ignore[method-assign]
        *server_cli("tfserving"),
        f"--port={server.grpc_port}",
        f"--rest_api_port={server.http_port}",
        f"--model_base_path={models / 'echo'}",
        "--model_name=echo",
        f"--ssl_config_file={_ssl_config(pki, tmp_path, True)}",
    ]
    with server:  # REST stays plain HTTP, as in TF Serving: the readiness probe needs no TLS
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "echo"
        request.inputs["x"].CopyFrom(_tf_tensor([5.0]))
        good = grpc.ssl_channel_credentials(
            pki["ca"].read_bytes(), pki["client_key"].read_bytes(), pki["client_cert"].read_bytes()
        )
        with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", good) as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert list(response.outputs["x"].float_val) == [5.0]
        anonymous = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        with (
            grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", anonymous) as channel,
            pytest.raises(grpc.RpcError),
        ):
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)


def server_cli(command: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "servekit", command]
