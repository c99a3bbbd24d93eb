"""Where a framework plugin finds its artifact in a version folder, laid out as servekit's peers lay it out.

A plugin names its own files (``model.json``, ``model.onnx``, ...) and says
whether a file is its own by reading the file's header (``accepts``).  On top
of that, every framework plugin honours the same three layouts, in this order:

1. ``options.artifact`` in ``servekit.yaml``: the file to serve, relative to
   the version folder (the MLflow plugin uses it to hand a flavor's data file
   to the plugin that serves that flavor; without it, a folder with an
   ``MLmodel`` file is left to the MLflow plugin);
2. an MLServer ``model-settings.json``: its ``parameters.uri`` names the file,
   and its ``implementation`` (``mlserver_xgboost.XGBoostModel``, ...) the
   runtime, so a folder written for MLServer serves unchanged;
3. the plugin's own names, then, as KServe's xgbserver/lgbserver look, the one
   file with one of the plugin's suffixes whose header the plugin accepts.

The header decides between plugins whose suffixes overlap (XGBoost and
LightGBM both write ``model.bst``): a file is claimed by at most one plugin,
so the order plugins are asked in does not matter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MODEL_SETTINGS = "model-settings.json"
#: an MLflow model folder: the MLflow plugin reads it and hands the flavor's file on
MLMODEL = "MLmodel"
#: bytes of a file read to recognise its format
HEADER_BYTES = 256


def header(file: Path) -> bytes:
    """The first bytes of ``file`` (empty when it cannot be read: then no plugin claims it)."""
    try:
        with file.open("rb") as f:
            return f.read(HEADER_BYTES)
    except OSError:
        return b""


def is_lightgbm_text(file: Path) -> bool:
    """LightGBM's model format, whatever the file is called: text that starts with a ``tree`` line.

    ``Booster.save_model`` always writes this text, also to ``model.bst``;
    XGBoost's ``model.bst`` is UBJSON (``{``) or its old binary format, neither
    of which can start with the four letters ``tree`` and a line break.
    """
    head = header(file)
    return head.startswith(b"tree\n") or head.startswith(b"tree\r\n")


def mlserver_settings(folder: Path) -> dict[str, Any] | None:
    """The folder's MLServer ``model-settings.json``, or ``None`` without one."""
    file = folder / MODEL_SETTINGS
    if not file.is_file():
        return None
    try:
        settings = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{MODEL_SETTINGS}: not readable JSON ({exc})") from exc
    if not isinstance(settings, dict):
        raise ValueError(f"{MODEL_SETTINGS}: expected a JSON object")
    return settings


def find_artifact(
    folder: Path,
    options: dict[str, Any],
    names: Iterable[str],
    accepts: Callable[[Path], bool],
    implementations: Iterable[str] = (),
) -> Path | None:
    """The plugin's artifact in ``folder``, or ``None`` when the folder is not the plugin's.

    :param names: the plugin's own file names, in order of preference; their
        suffixes are the ones searched for the KServe layout.
    :param accepts: whether a file (by suffix and header) is the plugin's.
    :param implementations: the MLServer ``implementation`` values of the
        plugin's framework; a ``model-settings.json`` naming one of them makes
        the folder the plugin's, and a missing ``uri`` file an error.
    """
    names = list(names)
    explicit = options.get("artifact")
    if explicit:
        file = folder / str(explicit)
        return file if file.is_file() and accepts(file) else None
    if (folder / MLMODEL).is_file():
        return None
    settings = mlserver_settings(folder)
    if settings is not None:
        found = _from_settings(folder, settings, accepts, set(implementations))
        if not isinstance(found, bool):
            return found
    for name in names:
        if (folder / name).is_file() and accepts(folder / name):
            return folder / name
    suffixes = {Path(n).suffix for n in names}
    candidates = sorted(p for p in folder.iterdir() if p.suffix in suffixes and p.is_file() and accepts(p))
    return candidates[0] if len(candidates) == 1 else None


def _from_settings(
    folder: Path, settings: dict[str, Any], accepts: Callable[[Path], bool], implementations: set[str]
) -> Path | None | bool:
    """The artifact ``model-settings.json`` names; ``None`` when it names another runtime; ``False``
    when it names no file (look for the plugin's own names then)."""
    implementation = settings.get("implementation")
    ours = implementation in implementations
    if implementation and not ours:
        return None
    uri = (settings.get("parameters") or {}).get("uri")
    if not uri:
        return False
    file = (folder / str(uri)).resolve()
    if not file.is_file():
        if ours:
            raise ValueError(f"{MODEL_SETTINGS}: parameters.uri {uri!r} is not a file in the model folder")
        return None
    return file if (ours or accepts(file)) else None
