"""Where the repository and the suite's data are, for tests at any depth of the tree."""

from __future__ import annotations

from pathlib import Path

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]
#: The suite's data: TF Serving's and Triton's example models, CRD schemas.
DATA = REPO / "tests" / "data"
#: TF Serving's test SavedModels.
TF_DATA = DATA / "tf_serving"
