"""Tiny torch models for the torch plugin's tests, saved in all three artifact forms.

The classes live in a ``model.py`` source string: the state-dict form needs the
file in the model folder, and the tests import the very same file to get the
reference module whose direct call the served answers must equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADER = """\
import torch
from torch import nn
"""

CLASSIFIER = '''

class Classifier(nn.Module):
    """One tensor in, class probabilities out."""

    def __init__(self, n_features: int = 4, n_classes: int = 3):
        super().__init__()
        self.linear = nn.Linear(n_features, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=-1)
'''

OTHERS = '''

class TwoHeads(nn.Module):
    """Two named inputs, a dict of two outputs."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, offset: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"scores": self.linear(x) + offset[:, None], "total": x.sum(dim=1)}


class Pair(nn.Module):
    """A tuple of two outputs."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x), x.mean(dim=1)


class Embedder(nn.Module):
    """Integer token ids and float weights: a weighted sum of embeddings."""

    def __init__(self, vocab: int = 10, dim: int = 3):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return (self.table(ids) * weights.unsqueeze(-1)).sum(dim=1)
'''

ALL_CLASSES = HEADER + CLASSIFIER + OTHERS
ONLY_CLASSIFIER = HEADER + CLASSIFIER


def import_source(folder: Path, source: str) -> Any:
    """Write ``model.py`` into ``folder`` and import it as the server will."""
    from servekit.hooks.manager import import_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source)
    return import_file(folder / "model.py")


def build(base: Path) -> dict[str, Any]:
    """Every served model folder under ``base``; returns the reference modules by model name."""
    import torch

    torch.manual_seed(0)
    classes = import_source(base / "sd_heads", ALL_CLASSES)
    clf, heads, pair = classes.Classifier().eval(), classes.TwoHeads().eval(), classes.Pair().eval()
    embed = classes.Embedder().eval()
    batch = torch.export.Dim("batch")

    def version(name: str) -> Path:
        folder = base / name / "1"
        folder.mkdir(parents=True)
        return folder

    # TorchScript
    torch.jit.save(torch.jit.script(clf), version("ts_clf") / "model.pt")
    torch.jit.save(torch.jit.script(heads), version("ts_heads") / "model.pt")
    (base / "ts_heads" / "servekit.yaml").write_text(
        "options: {inputs: {x: {datatype: FP32, shape: [-1, 4]}, offset: {datatype: FP32, shape: [-1]}}}\n"
    )
    torch.jit.save(torch.jit.trace(pair, torch.zeros(2, 4)), version("ts_pair") / "model.pt")
    # a traced dict module: its archive keeps no example; the output names come from a warm-up request
    traced_heads = torch.jit.trace(heads, (torch.zeros(2, 4), torch.zeros(2)), strict=False)
    torch.jit.save(traced_heads, version("ts_heads_warm") / "model.pt")
    (base / "ts_heads_warm" / "servekit.yaml").write_text(
        "warmup:\n"
        "  - v2: {inputs: [{name: x, datatype: FP32, shape: [1, 4], data: [0, 0, 0, 0]},"
        " {name: offset, datatype: FP32, shape: [1], data: [0]}]}\n"
    )
    # torch.export
    torch.export.save(
        torch.export.export(clf, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}}),
        version("ep_clf") / "model.pt2",
    )
    torch.export.save(
        torch.export.export(
            heads, (torch.zeros(2, 4), torch.zeros(2)), dynamic_shapes={"x": {0: batch}, "offset": {0: batch}}
        ),
        version("ep_heads") / "model.pt2",
    )
    # state dict + model.py: one class found alone, or named in servekit.yaml
    sd_clf = import_source(base / "sd_clf", ONLY_CLASSIFIER).Classifier().eval()
    sd_clf.load_state_dict(clf.state_dict())
    torch.save(clf.state_dict(), version("sd_clf") / "model.pth")
    for name, module, options in [
        ("sd_heads", heads, "{class: TwoHeads}"),
        ("sd_pair", pair, "{class: Pair, outputs: [logits, mean]}"),
        (
            "sd_embed",
            embed,
            (
                "{class: Embedder, inputs: {ids: {datatype: INT64, shape: [-1, 5]}, "
                "weights: {datatype: FP32, shape: [-1, 5]}}}"
            ),
        ),
    ]:
        if name != "sd_heads":
            import_source(base / name, ALL_CLASSES)
        torch.save(module.state_dict(), version(name) / "model.pth")
        (base / name / "servekit.yaml").write_text(f"options: {options}\n")
    return {
        "ts_clf": clf,
        "ep_clf": clf,
        "sd_clf": sd_clf,
        "ts_heads": heads,
        "ts_heads_warm": heads,
        "ep_heads": heads,
        "sd_heads": heads,
        "ts_pair": pair,
        "sd_pair": pair,
        "sd_embed": embed,
    }


def add_broken(base: Path, marker: Path) -> None:
    """Folders that must fail to load, each with a clear message (and no code run)."""
    import torch

    class Boom:  # unpickling this would create ``marker``
        def __reduce__(self):
            return (open, (str(marker), "w"))

    folder = base / "pickled" / "1"
    import_source(base / "pickled", ONLY_CLASSIFIER)
    folder.mkdir(parents=True)
    torch.save({"linear.weight": Boom()}, folder / "model.pth")

    folder = base / "two_classes" / "1"
    import_source(base / "two_classes", ALL_CLASSES)
    folder.mkdir(parents=True)
    torch.save({}, folder / "model.pth")

    folder = base / "not_script" / "1"
    folder.mkdir(parents=True)
    torch.save({"w": torch.zeros(1)}, folder / "model.pt")  # a state dict misnamed as TorchScript

    folder = base / "misnamed_keys" / "1"  # options.outputs that are not the dict's keys
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes((base / "ts_heads_warm" / "1" / "model.pt").read_bytes())
    (base / "misnamed_keys" / "servekit.yaml").write_text(
        (base / "ts_heads_warm" / "servekit.yaml").read_text() + "options: {outputs: [logits, sum]}\n"
    )

    folder = base / "on_gpu" / "1"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes((base / "ts_clf" / "1" / "model.pt").read_bytes())
    (base / "on_gpu" / "servekit.yaml").write_text("device: cuda\n")
