"""The KServe peer: a custom ``kserve.Model`` loading the same joblib files, as KServe users write it.

    python kserve_server.py --model_dir BASE --http_port 8080 --workers 1 --enable_grpc false
    python kserve_server.py --model_dir BASE --http_port 8080 --grpc_port 8081 --enable_grpc true

Serves every ``BASE/NAME/1/model.joblib`` as NAME on V1 (``instances``) and V2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import joblib
from kserve import InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.utils.utils import get_predict_input, get_predict_response


class SKLearnModel(Model):
    def __init__(self, name: str, path: Path):
        super().__init__(name)
        self.path = path
        self.model = None
        self.load()

    def load(self) -> bool:
        self.model = joblib.load(self.path)
        self.ready = True
        return self.ready

    def predict(self, payload: dict | InferRequest, headers: dict[str, str] = None) -> dict | InferResponse:
        instances = get_predict_input(payload)
        result = self.model.predict(instances)
        return get_predict_response(payload, result, self.name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--model_dir", required=True)
    args, _ = parser.parse_known_args()
    models = [SKLearnModel(p.parent.parent.name, p) for p in sorted(Path(args.model_dir).glob("*/1/model.joblib"))]
    ModelServer(workers=args.workers, enable_grpc=args.enable_grpc).start(models)
