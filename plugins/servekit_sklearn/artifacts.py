"""Reading a model file, with load errors that name the file and what was expected.

Unpickling garbage fails with whatever the pickle machine tripped over first:
``KeyError: 110``, a bare ``EOFError``, ``IndexError: index out of range``.
None of these says which file was wrong or what it should have held, and the
model's status is all an operator sees, so every failure is translated here
into "which file, what went wrong, what was expected".
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

#: what a pickle-based artifact should hold, said once for every message
EXPECTED_PICKLE = "expected an estimator saved with joblib.dump (or pickle.dump)"
EXPECTED_SKOPS = "expected an estimator saved with skops.io.dump"


def read_artifact(file: Path, options: dict[str, Any]) -> Any:
    """The object stored in ``file``; a ValueError naming the file when it cannot be read."""
    if file.suffix == ".skops":
        return _read_skops(file, options)
    return _read_pickle(file)


def _read_pickle(file: Path) -> Any:
    import joblib  # pickle: trusted files only (documented)

    if file.stat().st_size == 0:
        raise ValueError(f"{file.name}: the file is empty; {EXPECTED_PICKLE}")
    try:
        return joblib.load(file)
    except (ImportError, AttributeError) as exc:  # the file is fine, a class it names is not importable
        raise ValueError(f"{file.name}: {_missing_class(exc)}") from exc
    except (pickle.UnpicklingError, EOFError, KeyError, IndexError, ValueError, TypeError, OSError) as exc:
        raise ValueError(
            f"{file.name}: not a readable joblib/pickle file ({_describe(exc)}); {EXPECTED_PICKLE}"
        ) from exc


def _read_skops(file: Path, options: dict[str, Any]) -> Any:
    import skops.io

    trusted = options.get("trusted_types") or []
    try:
        found = skops.io.get_untrusted_types(file=file)
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise ValueError(f"{file.name}: not a readable skops file ({_describe(exc)}); {EXPECTED_SKOPS}") from exc
    untrusted = [t for t in found if t not in trusted]
    if untrusted:
        raise ValueError(
            f"{file.name} holds types that are not trusted: {', '.join(untrusted)}; "
            "list them under options.trusted_types in servekit.yaml if you trust them"
        )
    try:
        return skops.io.load(file, trusted=trusted or None)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{file.name}: {_missing_class(exc)}") from exc


def _missing_class(exc: Exception) -> str:
    return (
        f"it names a class that cannot be imported here ({_describe(exc)}); install the package "
        "that defines it, or for a class written in the training script, move it to an importable "
        "module before saving"
    )


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
