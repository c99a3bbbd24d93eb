"""A broken model file fails its load with an error that names the file and what was expected.

Each kind of breakage a deployment meets (garbage, an empty file, a copy cut
short, a class the serving environment lacks, an object that is no model) ends
the version (state END) with that message in its status.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import joblib
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn_models import fit_iris


def _truncated_joblib(folder: Path) -> None:
    fit_iris(folder.parent.parent / "whole", 1)
    data = (folder.parent.parent / "whole" / "1" / "model.joblib").read_bytes()
    (folder / "model.joblib").write_bytes(data[: len(data) // 2])


def _truncated_pickle(folder: Path) -> None:
    data = pickle.dumps(LogisticRegression().fit([[0.0], [1.0]], [0, 1]))
    (folder / "model.pkl").write_bytes(data[:300])


def _missing_class(folder: Path) -> None:
    """A pickle of a class from a module that the server cannot import."""
    module = folder / "trainer_only.py"
    module.write_text("class Model:\n    def predict(self, X):\n        return X\n")
    sys.path.insert(0, str(folder))
    try:
        import trainer_only

        joblib.dump(trainer_only.Model(), folder / "model.joblib")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("trainer_only", None)
        module.unlink()


BROKEN = {
    "garbage joblib": (
        lambda f: (f / "model.joblib").write_bytes(b"not a pickle"),
        "model.joblib: not a readable joblib/pickle file (KeyError: 110); expected an estimator saved with joblib.dump",
    ),
    "empty pkl": (
        lambda f: (f / "model.pkl").write_bytes(b""),
        "model.pkl: the file is empty; expected an estimator saved with joblib.dump",
    ),
    "truncated joblib": (_truncated_joblib, "model.joblib: not a readable joblib/pickle file ("),
    "truncated pickle": (
        _truncated_pickle,
        "model.pkl: not a readable joblib/pickle file (",
    ),  # UnpicklingError (EOFError on 3.10)
    "text file": (
        lambda f: (f / "model.pkl").write_text("hello\n"),
        "model.pkl: not a readable joblib/pickle file (",
    ),
    "garbage skops": (
        lambda f: (f / "model.skops").write_bytes(b"not a zip"),
        "model.skops: not a readable skops file (BadZipFile: File is not a zip file); expected an estimator "
        "saved with skops.io.dump",
    ),
    "class not importable": (
        _missing_class,
        "model.joblib: it names a class that cannot be imported here (ModuleNotFoundError: No module named "
        "'trainer_only')",
    ),
    "not a model": (
        lambda f: joblib.dump({"weights": [1, 2]}, f / "model.joblib"),
        "model.joblib holds a dict, which has neither a predict nor a transform method",
    ),
}


#: skops imports torch where torch is installed: its case runs out of the quick lane
SLOW = {"garbage skops"}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW else k for k in sorted(BROKEN)])
def test_broken_artifact_ends_the_version_naming_the_file(tmp_path, servekit_app, kind):
    make, expected = BROKEN[kind]
    folder = tmp_path / "models" / "m" / "1"
    folder.mkdir(parents=True)
    make(folder)
    client = servekit_app(tmp_path / "models")
    (status,) = client.get("/v1/models/m").get_json()["model_version_status"]
    assert status["state"] == "END"
    assert expected in status["status"]["error_message"]
    r = client.post("/v1/models/m:predict", json={"instances": [[1.0]]})
    assert r.status_code == 503 and expected in r.get_json()["error"]
