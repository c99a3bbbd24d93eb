"""Run by tests/e2e/test_kserve_client.py under KServe's own client (its own virtualenv): the calls
KServe's InferenceGRPCClient makes for V2 readiness and infer with BYTES and numeric tensors.

    python tests/support/kserve_grpc_client_calls.py 127.0.0.1:GRPC_PORT

Prints one JSON object of what each call answered, read the way KServe's users read it
(``output.data``).
"""

from __future__ import annotations

import asyncio
import json
import sys

from kserve import InferenceGRPCClient, InferInput, InferRequest


async def calls(address: str) -> dict:
    client = InferenceGRPCClient(address)
    try:
        found = {"model_ready": await client.is_model_ready("simple_string")}
        strings = [str(i) for i in range(16)]
        inputs = [
            InferInput("INPUT0", [1, 16], "BYTES", data=strings),
            InferInput("INPUT1", [1, 16], "BYTES", data=["1"] * 16),
        ]
        answer = await client.infer(InferRequest(model_name="simple_string", infer_inputs=inputs))
        found["strings"] = {o.name: [bytes(v).decode() for v in o.data] for o in answer.outputs}
        numbers = [
            InferInput("INPUT0", [1, 16], "INT32", data=list(range(16))),
            InferInput("INPUT1", [1, 16], "INT32", data=[1] * 16),
        ]
        answer = await client.infer(InferRequest(model_name="simple", infer_inputs=numbers))
        found["numbers"] = {o.name: list(o.data) for o in answer.outputs}
        return found
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(calls(sys.argv[1]))))
