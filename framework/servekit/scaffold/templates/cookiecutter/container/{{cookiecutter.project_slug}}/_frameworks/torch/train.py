"""Train version 1 of {{ cookiecutter.model_name }}: python train.py [VERSION_FOLDER] (default ./1).

A toy problem (the class is the largest of the first three features) stands in
for your data; servekit only needs ``VERSION/model.pth`` and ``Classifier`` in model.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import N_FEATURES, Classifier  # noqa: E402


def main(out: Path) -> Path:
    torch.manual_seed(0)
    x = torch.randn(1024, N_FEATURES)
    y = x[:, :3].argmax(dim=1)
    model = Classifier()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(300):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pth")
    return out / "model.pth"


if __name__ == "__main__":
    print("wrote", main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "1"))
