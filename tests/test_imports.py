"""No import cycle among servekit's modules, counting deferred and type-only imports.

A cycle that only works because one side imports inside a function or under
``TYPE_CHECKING`` still ties the modules together: the layering in
docs/architecture.md (protocol → codec → data plane → repository → plugins)
holds only if no lower layer reaches back up, whenever the import runs.  So the
graph here is read from the source with ``ast``, every ``import`` statement
included.  A package's ``__init__`` is not counted as imported by its
submodules' importers: re-exporting its children is what an ``__init__`` is for.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from lanes import wholly_slow

REPO = Path(__file__).resolve().parents[1]
PACKAGES = [
    REPO / "framework" / "servekit",
    *sorted(p for p in (REPO / "plugins").iterdir() if (p / "__init__.py").exists()),
]
#: Not modules of the package: the Jinja templates, and a plugin's tests beside it.
SKIP = ("scaffold/templates/", "tests/")


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module under ``package``."""
    found = {}
    for path in package.rglob("*.py"):
        if path.relative_to(package).as_posix().startswith(SKIP):
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.level, node.module)
            for alias in node.names:  # `from pkg import sub` imports the submodule
                sub = f"{base}.{alias.name}"
                edges.add(sub if sub in modules else base)
    edges.discard(name)
    return edges & modules.keys()


def _resolve(package: str, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, module] if module else parts)


def import_graph(packages: list[Path]) -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(module_files(package))
    return {name: imported(name, path, modules) for name, path in modules.items()}


@cache
def package_graph() -> dict[str, set[str]]:
    """The import graph of servekit and its plugins, read once for this module's tests (none changes it)."""
    return import_graph(PACKAGES)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_servekit_and_its_plugins_have_no_import_cycle():
    graph = package_graph()
    assert "servekit.dataplane" in graph and "servekit_sklearn" in graph
    found = cycles(graph)
    assert not found, "import cycles (deferred and TYPE_CHECKING imports count):\n" + "\n\n".join(
        describe(graph, c) for c in found
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(
    "b_source",
    [
        "def f():\n    from ..a import x\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n",
        "def f():\n    import pkg.a\n",
        "from .. import a\n",
    ],
    ids=["deferred", "type-only", "absolute", "from-package"],
)
def test_the_graph_sees_every_kind_of_import(tmp_path, b_source):
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .sub.b import y\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": b_source,
        },
    )
    graph = import_graph([package])
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_an_acyclic_package_passes(tmp_path):
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import x\nfrom .b import y\n",
            "pkg/a.py": "from .b import y\nx = y\n",
            "pkg/b.py": "import os\ny = 1\n",
        },
    )
    graph = import_graph([package])
    assert graph["pkg.a"] == {"pkg.b"} and cycles(graph) == []


#: Modules the protocols share: helpers and documents, which import no protocol themselves.
PROTOCOL_HELPERS = {
    "servekit.protocols.http",
    "servekit.protocols.streaming",
    "servekit.protocols.openai_requests",
    "servekit.protocols.openai_fields",
    "servekit.protocols.openai_responses",
    "servekit.protocols.vllm_tokens",
    "servekit.protocols.generate_requests",
    "servekit.protocols.v2_documents",
    "servekit.protocols.tf_documents",
    "servekit.protocols.grpc.common",
    "servekit.protocols.grpc.predict_stream",
    "servekit.protocols.grpc.generate_stream",
    "servekit.protocols.model_control",
    "servekit.protocols.warmup",
}
#: What assembles the gRPC server from its services (as server/app.py does for HTTP).
GRPC_ASSEMBLY = {
    "servekit.protocols.grpc",
    "servekit.protocols.grpc.dispatch",
    "servekit.protocols.grpc.compile_protos",
}


def test_protocols_do_not_import_each_other():
    """Each wire protocol reaches the others' work only through the shared helpers and the data plane."""
    graph = package_graph()
    protocols = {
        m
        for m in graph
        if m.startswith("servekit.protocols.") and ".protos" not in m and m not in PROTOCOL_HELPERS | GRPC_ASSEMBLY
    }
    assert {"servekit.protocols.v1", "servekit.protocols.v2", "servekit.protocols.grpc.v2"} <= protocols
    crossing = {
        m: sorted(graph[m] & protocols) for m in sorted(protocols | PROTOCOL_HELPERS) if graph.get(m, set()) & protocols
    }
    assert not crossing, f"protocol modules importing protocols: {crossing}"


def folder_of(module: str) -> str:
    """The unit a module belongs to: its first-level folder (``servekit.hosts``), or itself at the root."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with each folder as one node: a cycle through two folders shows here
    even when no two modules import each other."""
    folders: dict[str, set[str]] = {}
    for module, edges in graph.items():
        unit = folder_of(module)
        folders.setdefault(unit, set()).update(folder_of(e) for e in edges)
    for unit, edges in folders.items():
        edges.discard(unit)
        edges &= folders.keys()
    return folders


def test_no_import_cycle_between_folders():
    """hosts/, control/, protocols/, server/, ...: each folder sits above or below another, never both."""
    graph = folder_graph(package_graph())
    assert "servekit.hosts" in graph and "servekit.dataplane" in graph
    found = cycles(graph)
    assert not found, "import cycles between folders:\n" + "\n\n".join(describe(graph, c) for c in found)


def test_the_folder_graph_sees_a_cycle_through_two_folders(tmp_path):
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core.py": "from .low import b\n",
            "pkg/top.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/a.py": "from .. import core\n",
            "pkg/low/b.py": "",
        },
    )
    graph = import_graph([package])
    assert cycles(graph) == []  # no two modules import each other ...
    assert cycles(folder_graph(graph)) == [["pkg.core", "pkg.low"]]  # ... but the folder and core do


def test_protocols_pages_and_observability_reach_models_through_the_planes():
    """No ``x.repository`` attribute chains outside the planes: the data plane (what is loaded
    here) and the control plane (what to serve) are the only ways in (server/app.py builds them)."""
    reaching = []
    for folder in ("protocols", "server", "observability"):
        for path in sorted((REPO / "framework" / "servekit" / folder).rglob("*.py")):
            if path.name == "app.py" or "protos" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "repository":
                    reaching.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not reaching, f"reaching into the repository: {reaching}"


#: The modules a plugin may import servekit through: the public face, the errors, the types.
PLUGIN_API = {"servekit", "servekit.errors", "servekit.types"}


def test_plugins_import_only_the_public_plugin_api():
    """First-party plugins use what a third-party plugin can: ``servekit``, ``servekit.errors``, ``servekit.types``."""
    graph = package_graph()
    reaching = {
        module: sorted(
            e for e in edges if e.startswith("servekit") and e.split(".")[0] == "servekit" and e not in PLUGIN_API
        )
        for module, edges in graph.items()
        if module.startswith("servekit_")
    }
    reaching = {m: e for m, e in reaching.items() if e}
    assert not reaching, (
        f"plugins importing servekit's internals (add what they need to servekit.PLUGIN_API): {reaching}"
    )


def test_every_name_of_the_plugin_api_imports():
    import servekit

    for name, module in servekit.PLUGIN_API.items():
        assert getattr(servekit, name) is getattr(importlib.import_module(module), name)
        assert name in servekit.__all__


def test_the_package_root_holds_only_the_kernel():
    """At most eight modules beside the layers' folders, and no prefix family standing in for a folder."""
    root = REPO / "framework" / "servekit"
    modules = sorted(p.stem for p in root.glob("*.py"))
    assert len(modules) <= 8, modules
    prefixes = Counter(name.split("_")[0] for name in modules if "_" in name.strip("_"))
    assert not [p for p, n in prefixes.items() if n > 1], f"prefix families at the root: {prefixes}"


def test_nothing_inside_servekit_imports_its_public_face():
    """``servekit/__init__.py`` re-exports from every layer, so a layer that imported it would close a cycle."""
    graph = package_graph()
    importers = sorted(m for m, edges in graph.items() if "servekit" in edges and m.startswith("servekit."))
    assert not importers, importers


def test_old_module_paths_still_import_and_warn():
    import servekit
    from servekit.folders import artifacts

    for new in servekit.MOVED.values():
        assert importlib.util.find_spec(new) is not None, new
    sys.modules.pop("servekit.model_files", None)
    with pytest.warns(DeprecationWarning, match="servekit.model_files moved to servekit.folders.artifacts"):
        old = importlib.import_module("servekit.model_files")
    assert old is artifacts


#: What the quick lane must not import at collection: each costs seconds, and the quick lane
#: runs where they are not installed.
HEAVY = {"torch", "tensorflow", "transformers", "tensorflow_serving", "keras"}
TEST_ROOTS = [REPO / "tests", *sorted((REPO / "plugins").glob("*/tests"))]
SUPPORT = REPO / "tests" / "support"


def module_level_imports(path: Path) -> set[str]:
    """Top-level package names a module imports when it is imported (function bodies excluded)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])
            elif isinstance(node, (ast.Expr, ast.Assign)):
                # pytest.importorskip("torch") at module level imports it too
                for call in ast.walk(node):
                    if (
                        isinstance(call, ast.Call)
                        and getattr(call.func, "attr", None) == "importorskip"
                        and call.args
                        and isinstance(call.args[0], ast.Constant)
                    ):
                        found.add(str(call.args[0].value).split(".")[0])

    visit(ast.parse(path.read_text()).body)
    return found


def heavy_imports(path: Path, support: Path = SUPPORT, seen: set[Path] | None = None) -> set[str]:
    """The heavy frameworks a module imports at module level, through the suite's helpers too."""
    seen = seen if seen is not None else set()
    seen.add(path)
    names = module_level_imports(path)
    heavy = names & HEAVY
    for name in names:
        helper = support / f"{name}.py"
        if helper.exists() and helper not in seen:
            heavy |= heavy_imports(helper, support, seen)
    return heavy


def test_the_quick_lane_imports_neither_torch_nor_tensorflow():
    """A module the quick lane collects imports no heavy framework at module level (inside a test is fine);
    a module whose tests are all slow is not collected by the quick lane (conftest.py)."""
    offending = {}
    for root in TEST_ROOTS:
        for path in sorted(root.rglob("test_*.py")):
            heavy = heavy_imports(path)
            if heavy and not wholly_slow(path):
                offending[str(path.relative_to(REPO))] = sorted(heavy)
    assert not offending, offending


def test_the_heavy_import_check_sees_helpers_and_importorskip(tmp_path):
    (tmp_path / "test_a.py").write_text('import pytest\ntorch = pytest.importorskip("torch")\n')
    (tmp_path / "test_b.py").write_text("from torch_helper import build\n")
    (tmp_path / "torch_helper.py").write_text("import torch\n")
    (tmp_path / "test_c.py").write_text("def test():\n    import torch\n")
    assert heavy_imports(tmp_path / "test_a.py") == {"torch"}
    assert heavy_imports(tmp_path / "test_b.py", support=tmp_path) == {"torch"}  # through a helper
    assert heavy_imports(tmp_path / "test_c.py") == set()


# -- docs/architecture.md draws the folders --------------------------------------------------------

ARCHITECTURE = REPO / "docs" / "architecture.md"
KERNEL = {"servekit.errors", "servekit.types", "servekit.streams", "servekit.routes", "servekit.version"}


def layer_of(module: str) -> str:
    """The box a module is drawn in on docs/architecture.md."""
    if not module.startswith("servekit.") and module != "servekit":
        return "plugins"
    if module == "servekit":
        return "public-face"
    if module in KERNEL:
        return "kernel"
    return module.split(".")[1]


def drawn_arrows(graph: dict[str, set[str]]) -> str:
    """The arrows block of docs/architecture.md, as the source has it."""
    arrows: dict[str, set[str]] = {}
    for module, edges in graph.items():
        arrows.setdefault(layer_of(module), set()).update(layer_of(e) for e in edges)
    lines = []
    for layer in sorted(arrows):
        targets = sorted(arrows[layer] - {layer})
        if targets:
            lines.append(f"{layer:<14} -> {' '.join(targets)}")
    return "\n".join(lines)


def test_the_architecture_page_draws_every_folder_and_its_arrows():
    page = ARCHITECTURE.read_text()
    folders = sorted(
        p.name for p in (REPO / "framework" / "servekit").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    picture = page.split("```")[1]
    missing = [f for f in folders if f"{f}/" not in picture]
    assert not missing, f"docs/architecture.md's picture lacks the folders {missing}"
    drawn = page.split("<!-- arrows: start -->")[1].split("<!-- arrows: end -->")[0].strip().strip("`").strip()
    actual = drawn_arrows(package_graph())
    assert drawn == actual, f"docs/architecture.md's arrows drifted; the source has:\n{actual}"


def test_the_arrows_follow_a_new_folder(tmp_path):
    package = _write(tmp_path, {"servekit/__init__.py": "", "servekit/errors.py": "", "servekit/new/__init__.py": ""})
    (package.parent / "servekit" / "new" / "a.py").write_text("from servekit import errors\n")
    graph = import_graph([package.parent / "servekit"])
    assert drawn_arrows(graph) == "new            -> kernel"


def test_a_module_that_became_a_package_keeps_its_names_and_its_submodules_do_not_warn():
    import warnings

    from servekit.dataplane.data_plane import DataPlane

    with pytest.warns(DeprecationWarning, match="servekit.dataplane.DataPlane moved to servekit.dataplane.data_plane"):
        from servekit.dataplane import DataPlane as old
    assert old is DataPlane
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from servekit.cli import tfserving  # noqa: F401  (a submodule, not an old name)
        from servekit.dataplane import batching  # noqa: F401


def test_an_old_module_name_still_runs_with_python_m():
    """``python -m servekit.tfserving_cli`` (a manifest written before 0.2.0) runs the module's new code."""
    sys.modules.pop("servekit.tfserving_cli", None)
    spec = importlib.util.find_spec("servekit.tfserving_cli")  # as runpy finds it, then asks for the code
    assert spec is not None and spec.loader is not None
    with pytest.warns(DeprecationWarning, match="servekit.tfserving_cli moved to servekit.cli.tfserving"):
        code = spec.loader.get_code("servekit.tfserving_cli")
    assert code.co_filename.endswith("cli/tfserving.py")


def test_the_long_poles_the_parallel_run_starts_first_exist():
    from lanes import LONG_POLES, long_poles_first

    assert all((REPO / path).is_file() for path in LONG_POLES), [p for p in LONG_POLES if not (REPO / p).is_file()]
    paths = ["tests/a.py", LONG_POLES[1], "tests/b.py", LONG_POLES[0]]
    assert [paths[i] for i in long_poles_first(paths)] == [LONG_POLES[0], LONG_POLES[1], "tests/a.py", "tests/b.py"]


def test_the_alone_lane_imports_only_modules_that_mark_a_test_alone(tmp_path):
    """``--alone`` skips importing a module with no alone mark, so a test marked alone must say so in its module."""
    from lanes import marks_alone

    modules = [*(REPO / "tests").rglob("test_*.py"), *(REPO / "plugins").rglob("test_*.py")]
    marked = [p for p in modules if marks_alone(p)]
    assert {p.relative_to(REPO).as_posix() for p in marked} >= {
        "tests/observability/test_load_signal.py",
        "tests/server/test_engines.py",
    }
    module = tmp_path / "test_x.py"
    module.write_text("import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.alone]\n")
    assert marks_alone(module)
    module.write_text("import pytest\n\n\ndef test_x():\n    alone = 1\n")
    assert not marks_alone(module)
