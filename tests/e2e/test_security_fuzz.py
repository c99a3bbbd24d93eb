"""Fuzzing the locked server: schemathesis over /openapi.json, random and truncated gRPC messages.

The server runs as in production: TLS, scoped API keys, model control on.
schemathesis drives every operation of the published document (model control
last: an unload makes later inference answer 503 by design) with the all-scope
key and checks each answer against the document, and that secured operations
refuse a request without the key (``ignored_auth``).  The gRPC fuzz sends every
method of both services random bytes, truncated and bit-flipped valid
messages: no RPC may hang (the deadline passes), fail with ``UNKNOWN``/
``INTERNAL`` (an exception servekit did not map), or take the server down.

``SERVEKIT_FUZZ_EXAMPLES`` sets the schemathesis examples per operation (default
60: about 3,000 requests) and ``SERVEKIT_FUZZ_GRPC`` the gRPC calls (default 3,000).
"""

from __future__ import annotations

import os
import random

import grpc
import pytest
import requests
from schemathesis_run import fuzz_operations
from servekit.testing import ServerProcess
from sklearn_models import fit_regressor

pytestmark = pytest.mark.slow

schemathesis = pytest.importorskip("schemathesis")
trustme = pytest.importorskip("trustme")

KEY = "fuzz-all-scopes-key"
EXAMPLES = int(os.environ.get("SERVEKIT_FUZZ_EXAMPLES", "60"))
GRPC_CALLS = int(os.environ.get("SERVEKIT_FUZZ_GRPC", "3000"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_pki")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    return paths


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    import ssl

    base = tmp_path_factory.mktemp("fuzz_models")
    fit_regressor(base / "linear")  # implements every hook the document lists (an echo model would 501)
    keys = tmp_path_factory.mktemp("fuzz_keys") / "keys"
    keys.write_text(f"* {KEY}\ninfer infer-only-key\n")
    with ServerProcess(
        base,
        workers=2,
        threads=8,
        grpc_port="auto",
        tls_cert=pki["cert"],
        tls_key=pki["key"],
        api_key_file=keys,
        model_control_mode="explicit",
        max_request_size=1024 * 1024,
        client_ssl=ssl.create_default_context(cafile=str(pki["ca"])),
    ) as running:
        yield running


@schemathesis.check
def not_a_server_fault(ctx, response, case):
    """Any 5xx but 501, servekit's answer for a hook the model does not implement (e.g. embeddings)."""
    if response.status_code >= 500 and response.status_code != 501:
        raise schemathesis.checks.ServerError(operation=case.operation.label, status_code=response.status_code)


CHECKS = [
    not_a_server_fault,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.ignored_auth,
]


def test_schemathesis_over_every_operation_with_tls_and_keys(server, pki):
    document = requests.get(server.url + "/openapi.json", verify=str(pki["ca"]), headers=_auth(), timeout=30).json()
    loaded = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in loaded.get_all_operations()]
    operations.sort(key=lambda op: op.path.startswith("/v2/repository/"))  # model control last
    with requests.Session() as session:  # kept alive: one TLS handshake, not one per request
        failures, sent = fuzz_operations(
            operations,
            lambda case: case.call_and_validate(
                base_url=server.url, session=session, headers=_auth(), checks=CHECKS, timeout=30, verify=str(pki["ca"])
            ),
            EXAMPLES,
        )
    print(f"\nschemathesis: {len(operations)} operations, {sent} requests, {len(failures)} failing")
    assert len(operations) > 40
    assert not failures, "\n\n".join(failures)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


# -- gRPC ------------------------------------------------------------------------------------


def _methods() -> list[tuple[str, bool, bool, bytes]]:
    """(path, client streams, server streams, a valid request) for every method of both services."""
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
    from servekit.protocols.grpc.protos.tensorflow_serving.apis import (
        model_service_pb2,
        predict_pb2,
        prediction_service_pb2,
    )

    valid = v2.ModelInferRequest(model_name="linear")
    valid.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    valid.raw_input_contents.append(b"\x00" * 8)
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "linear"
    predict.inputs["x"].dtype = 1
    predict.inputs["x"].tensor_shape.dim.add(size=1)
    predict.inputs["x"].tensor_shape.dim.add(size=2)
    predict.inputs["x"].float_val.extend([1.0, 2.0])
    samples = {"ModelInferRequest": valid.SerializeToString(), "PredictRequest": predict.SerializeToString()}
    out = []
    for module in (v2, prediction_service_pb2, model_service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                sample = samples.get(method.input_type.name, b"\x0a\x06linear")
                out.append(
                    (f"/{service.full_name}/{method.name}", method.client_streaming, method.server_streaming, sample)
                )
    return out


def _mutations(rng: random.Random, sample: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:  # random bytes
        return rng.randbytes(rng.randrange(0, 200))
    if kind == 1:  # a valid message cut short
        return sample[: rng.randrange(0, max(1, len(sample)))]
    if kind == 2:  # bit flips
        data = bytearray(sample)
        for _ in range(rng.randrange(1, 4)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    return sample + rng.randbytes(rng.randrange(1, 40))  # trailing garbage


BAD = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}


def test_grpc_fuzz_of_both_services_no_crash_no_hang(server, pki):
    rng = random.Random(22)
    methods = _methods()
    credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
    metadata = [("authorization", f"Bearer {KEY}")]
    seen: dict[str, int] = {}
    bad: list[str] = []
    with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", credentials) as channel:
        for i in range(GRPC_CALLS):
            path, client_streams, server_streams, sample = methods[i % len(methods)]
            payload = _mutations(rng, sample)
            code = _call(channel, path, client_streams, server_streams, payload, metadata)
            seen[code.name] = seen.get(code.name, 0) + 1
            if code in BAD:
                bad.append(f"{path} {payload!r:.120} -> {code.name}")
        print(f"\ngRPC fuzz: {GRPC_CALLS} calls over {len(methods)} methods: {seen}")
        assert not bad, "\n".join(bad[:20])
        from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as v2
        from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as v2_grpc

        assert v2_grpc.GRPCInferenceServiceStub(channel).ServerLive(v2.ServerLiveRequest(), timeout=10).live
    assert server.proc.poll() is None


def _call(channel, path, client_streams, server_streams, payload, metadata) -> grpc.StatusCode:
    identity = dict(request_serializer=None, response_deserializer=None)
    try:
        if client_streams and server_streams:
            call = channel.stream_stream(path, **identity)
            for _ in call(iter([payload, payload]), timeout=10, metadata=metadata):
                pass
        elif server_streams:
            for _ in channel.unary_stream(path, **identity)(payload, timeout=10, metadata=metadata):
                pass
        elif client_streams:
            channel.stream_unary(path, **identity)(iter([payload]), timeout=10, metadata=metadata)
        else:
            channel.unary_unary(path, **identity)(payload, timeout=10, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
