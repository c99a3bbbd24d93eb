"""The plain peer: sentence-transformers' ``CrossEncoder`` behind FastAPI and uvicorn, as its users write it.

    python cross_encoder_fastapi.py --model FOLDER --port 8080 [--workers 1]

``POST /rerank`` with TEI's body (``query``, ``texts``) answers ``[{"index", "score"}]`` best first.
"""

from __future__ import annotations

import argparse
import os

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import CrossEncoder

app = FastAPI()
model: CrossEncoder | None = None


@app.on_event("startup")
def load() -> None:
    global model
    model = CrossEncoder(os.environ["CROSS_ENCODER_FOLDER"], device="cpu")


class Rerank(BaseModel):
    query: str
    texts: list[str]


@app.post("/rerank")
def rerank(body: Rerank) -> list[dict]:
    assert model is not None
    scores = model.predict([(body.query, text) for text in body.texts])
    ranked = sorted(enumerate(scores.tolist()), key=lambda pair: -pair[1])
    return [{"index": i, "score": s} for i, s in ranked]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ["CROSS_ENCODER_FOLDER"] = args.model
    uvicorn.run(
        "cross_encoder_fastapi:app", host="127.0.0.1", port=args.port, workers=args.workers, log_level="warning"
    )
