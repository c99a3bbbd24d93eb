"""A ``model.py`` imports the modules beside it, without touching ``sys.path``.

Inserting the model's folder into ``sys.path`` while ``model.py`` runs (and
removing it after) races with every other thread that imports at that moment:
the import system walks the ``sys.path`` list itself, and an entry removed in
front of its place shifts the rest, so the walk skips one, often
site-packages.  A gRPC server started while a worker loaded its models
then failed with "No module named 'grpc'" although grpcio was installed.

Instead one finder sits in ``sys.meta_path`` (installed once, when this
module is imported) and answers top-level imports from the folders of the
``model.py`` files that the *calling thread* is running, innermost first; any
other thread never sees them.  :func:`forget` drops the cached modules a
folder gave, so a version's code is read afresh when it loads again; the
modules it gives are compiled from their source (:class:`FreshSourceLoader`), never
from a cached ``.pyc`` that may be older than the file.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


class FreshSourceLoader(importlib.machinery.SourceFileLoader):
    """Compiles the file from its source at every import, reading and writing no bytecode.

    The default loader runs a cached ``.pyc`` whose recorded source size and
    modification time (whole seconds) match the file: a ``model.py`` rewritten in
    the same second with the same length would load its old code.  A model
    folder's code is small and loads rarely, so it is compiled as it is now.
    """

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


def fresh_spec(spec: importlib.machinery.ModuleSpec | None) -> importlib.machinery.ModuleSpec | None:
    """``spec`` with its source loader replaced by a :class:`FreshSourceLoader`."""
    if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
        spec.loader = FreshSourceLoader(spec.loader.name, spec.loader.path)
    return spec


class _SiblingFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._local = threading.local()
        #: top-level names this finder answered (a model folder's modules, in sys.modules)
        self.served: set[str] = set()

    def folders(self) -> list[str]:
        stack: list[str] | None = getattr(self._local, "folders", None)
        if stack is None:
            stack = self._local.folders = []
        return stack

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        stack = getattr(self._local, "folders", None)
        if not stack:
            return None
        if path is not None:  # a submodule of a package from a model folder: read afresh too
            inside = tuple(os.path.join(folder, "") for folder in stack)
            if not any(str(entry).startswith(inside) for entry in path):
                return None
            return fresh_spec(importlib.machinery.PathFinder.find_spec(fullname, path))
        spec = importlib.machinery.PathFinder.find_spec(fullname, list(reversed(stack)))
        if spec is not None:
            self.served.add(fullname)
        return fresh_spec(spec)


_FINDER = _SiblingFinder()


def _install() -> None:
    """Before the path finder (as ``sys.path[0]`` was), after the built-in and frozen ones."""
    if _FINDER in sys.meta_path:
        return
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, _FINDER)


_install()


@contextlib.contextmanager
def beside(folder: Path) -> Iterator[None]:
    """While the block runs, this thread's top-level imports look in ``folder`` first."""
    stack = _FINDER.folders()
    stack.append(str(folder))
    try:
        yield
    finally:
        stack.pop()


def forget(folder: Path) -> None:
    """Drop from ``sys.modules`` what a ``model.py`` in ``folder`` would import from beside it.

    That is every module from a file under ``folder``, and every module another
    model folder gave under a name that ``folder`` has too (two models' own
    ``utils.py``), so each ``model.py`` gets its own siblings, read afresh.
    """
    root = folder.resolve()
    # the folder as given and as resolved: a string test per module, no system call
    prefixes = tuple({os.path.join(str(folder.absolute()), ""), os.path.join(str(root), "")})
    # a copy taken in one step: another thread may import while this loop runs
    for name, module in sys.modules.copy().items():
        top = name.partition(".")[0]
        if top in _FINDER.served and ((root / f"{top}.py").is_file() or (root / top).is_dir()):
            sys.modules.pop(name, None)
            continue
        file: Any = getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(prefixes):
            sys.modules.pop(name, None)
