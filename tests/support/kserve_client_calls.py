"""Run by tests/e2e/test_kserve_client.py under KServe's own client (its own virtualenv): the calls
KServe's InferenceRESTClient makes for V1 liveness, readiness and predict, and V2 infer.

    python tests/support/kserve_client_calls.py http://127.0.0.1:PORT MODEL

Prints one JSON object of what each call answered.
"""

from __future__ import annotations

import asyncio
import json
import sys

from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def calls(base: str, model: str) -> dict:
    v1 = InferenceRESTClient(RESTConfig(protocol="v1"))
    v2 = InferenceRESTClient(RESTConfig(protocol="v2"))
    try:
        row = [5.1, 3.5, 1.4, 0.2]
        found = {
            "v1_live": await v1.is_server_live(base),
            "v1_model_ready": await v1.is_model_ready(base, model),
            "v1_predict": await v1.infer(base, {"instances": [row]}, model_name=model),
            "v2_ready": await v2.is_server_ready(base),
            "v2_model_ready": await v2.is_model_ready(base, model),
        }
        request = InferRequest(model_name=model, infer_inputs=[InferInput("input", [1, 4], "FP64", data=row)])
        answer = await v2.infer(base, request, model_name=model)
        found["v2_infer"] = {o.name: list(o.data) for o in answer.outputs}
        try:
            await v1.is_model_ready(base, "no-such-model")
            found["v1_unknown_ready"] = "answered"
        except Exception as exc:  # KServe's client raises on a 404
            found["v1_unknown_ready"] = type(exc).__name__
        return found
    finally:
        await v1.close()
        await v2.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(calls(sys.argv[1], sys.argv[2]))))
