"""A 1M-element FP32 tensor through servekit's echo model: V2 JSON vs the binary extension (and gRPC).

    python bench/big_tensor.py http://127.0.0.1:8080                    # JSON and binary
    python bench/big_tensor.py http://127.0.0.1:8080 127.0.0.1:8081     # and V2 gRPC raw contents

End to end, as a client sees it: encode the request, send it, receive the
answer (the same tensor back), decode it to numpy.  Prints one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import orjson
import requests

N = 1_000_000
REPEAT = 5


def via_json(session: requests.Session, url: str, x: np.ndarray) -> np.ndarray:
    body = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [N], "datatype": "FP32", "data": x}]}, option=orjson.OPT_SERIALIZE_NUMPY
    )
    resp = session.post(url, data=body, headers={"Content-Type": "application/json"})
    resp.raise_for_status()
    out = orjson.loads(resp.content)["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32)


def via_binary(session: requests.Session, url: str, x: np.ndarray) -> np.ndarray:
    header = orjson.dumps(
        {
            "inputs": [{"name": "x", "shape": [N], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}],
            "parameters": {"binary_data_output": True},  # every output binary, whatever the model names it
        }
    )
    resp = session.post(
        url,
        data=header + x.tobytes(),
        headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    resp.raise_for_status()
    length = int(resp.headers["Inference-Header-Content-Length"])
    return np.frombuffer(resp.content[length:], dtype=np.float32)


def via_grpc(stub, x: np.ndarray) -> np.ndarray:
    from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[N])
    request.raw_input_contents.append(x.tobytes())
    response = stub.ModelInfer(request, timeout=60)
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32)


def timed(fn, *args) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def main() -> None:
    url = sys.argv[1].rstrip("/") + "/v2/models/echo/infer"
    x = np.random.default_rng(0).random(N, dtype=np.float32)
    session = requests.Session()
    calls = [("json", via_json, (session, url)), ("binary", via_binary, (session, url))]
    if len(sys.argv) > 2:
        import grpc
        from servekit.protocols.grpc.protos.inference import grpc_service_pb2_grpc as pb_grpc

        size = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        channel = grpc.insecure_channel(sys.argv[2], options=size)
        calls.append(("grpc", via_grpc, (pb_grpc.GRPCInferenceServiceStub(channel),)))
    result = {}
    for name, fn, args in calls:
        fn(*args, x)  # warm-up
        times = []
        for _ in range(REPEAT):
            seconds, out = timed(fn, *args, x)
            if out.shape != x.shape or not np.array_equal(out, x):
                raise SystemExit(f"{name}: the echo differs from what was sent")
            times.append(seconds)
        result[f"{name}_s"] = round(statistics.median(times), 4)
    result["speedup"] = round(result["json_s"] / result["binary_s"], 1)
    if "grpc_s" in result:
        result["grpc_speedup"] = round(result["json_s"] / result["grpc_s"], 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
