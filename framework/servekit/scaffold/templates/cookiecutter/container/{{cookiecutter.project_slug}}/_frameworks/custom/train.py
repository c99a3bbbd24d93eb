"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

Fits score = 3*f0 - 2*f1 + 0.5*f2 + 1 by least squares and writes ``weights.json``,
the artifact model.py's ``load`` reads.  Use any format your ``load`` understands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FEATURES = ["f0", "f1", "f2"]


def main(out: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, len(FEATURES)))
    y = x @ np.array([3.0, -2.0, 0.5]) + 1.0
    coef, *_ = np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), y, rcond=None)
    out.mkdir(parents=True, exist_ok=True)
    weights = {"features": FEATURES, "weights": [round(c, 6) for c in coef[:-1]], "bias": round(coef[-1], 6)}
    (out / "weights.json").write_text(json.dumps(weights, indent=2) + "\n")
    return out / "weights.json"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
