"""Model folders on disk: which folders are models, their version folders and fingerprints.

The layout is TF Serving's: ``BASE/NAME/VERSION/<artifact>``.  A model folder
without numeric sub-folders is served as version 1; a folder holding only
sub-folders (besides notes and Python helpers other than ``model.py``) is a
repository of models.  Read by the control plane (what to
serve) and by the repository (what it loaded from where); imports nothing of
servekit's but the config error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from servekit.folders.servekit_yaml import ConfigError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: Files that make no folder a model: notes, and Python files other than the hooks' ``model.py``
#: (a ``train.py`` or a helper beside the model folders of a repository).
_IGNORED_FILES = re.compile(r"^(\..*|README.*|LICENSE.*|.*\.md|.*\.txt|(?!model\.py$).*\.py)$", re.IGNORECASE)


def valid_name(name: str) -> bool:
    return bool(_NAME_RE.match(name)) and ".." not in name


def version_of(entry: Path) -> int | None:
    """The version number a folder stands for, ``None`` when it is no version folder."""
    if entry.is_dir() and entry.name.isascii() and entry.name.isdigit() and int(entry.name) > 0:
        return int(entry.name)
    return None


def is_model_dir(path: Path) -> bool:
    """A model folder holds numeric version folders or artifact files; a repository holds neither."""
    for entry in path.iterdir():
        if version_of(entry) is not None:
            return True
        if entry.is_file() and not _IGNORED_FILES.match(entry.name):
            return True
    return False


def is_versioned(folder: Path) -> bool:
    """Whether a model folder holds version folders (else the folder itself is version 1)."""
    try:
        return any(version_of(e) is not None for e in folder.iterdir())
    except OSError:
        return True


def repository_roots(paths: list[Path]) -> list[Path]:
    """The paths that are repositories (folders of model folders), where new models may appear."""
    return [Path(p) for p in paths if Path(p).is_dir() and not is_model_dir(Path(p))]


def model_folders_in(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def discover(paths: list[Path], model_name: str | None = None) -> dict[str, Path]:
    """Model names and folders from the paths given on the command line."""
    found: dict[str, Path] = {}
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"model path not found: {path}")
        for folder in [path] if is_model_dir(path) else model_folders_in(path):
            name = Path(os.path.abspath(folder)).name  # `servekit serve .` names the model after this folder
            if name in found:
                raise ConfigError(f"two model folders are named {name!r}: {found[name]} and {folder}")
            found[name] = folder
    if model_name:
        if len(found) != 1:
            raise ConfigError(f"--model-name names one model, but {len(found)} model folders were found")
        found = {model_name: next(iter(found.values()))}
    for name in found:
        if not valid_name(name):
            raise ConfigError(f"invalid model name {name!r}: use letters, digits, '.', '_' and '-'")
    return found


def versions_on_disk(base_path: Path, versioned: bool) -> dict[int, Path]:
    """The version folders of a model folder (the folder itself as version 1 when unversioned)."""
    if not base_path.is_dir():
        return {}
    found = {v: e for e in base_path.iterdir() if (v := version_of(e)) is not None}
    if not versioned:
        return found or {1: base_path}
    return found


def fingerprint(path: Path) -> float:
    """The newest modification time in a version folder: a changed folder is loaded again."""
    try:
        return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.iterdir()])
    except OSError:
        return 0.0


def folder_bytes(path: Path) -> int:
    """The size of a version's files: what the memory budget counts for it."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for entry in path.rglob("*"):
        try:
            if entry.is_file():
                total += entry.stat().st_size
        except OSError:
            continue
    return total
