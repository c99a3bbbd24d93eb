"""Meta-tests: every hook has a docstring, a section in docs/hooks.md with runnable code, and a test."""

from __future__ import annotations

import re

import pytest
from repo_paths import REPO as ROOT
from servekit.hooks import manager as plugins
from servekit.hooks import specs as hookspecs

DOCS = (ROOT / "docs" / "hooks.md").read_text()
HOOKS = sorted(name for name in dir(plugins.new_manager().hook) if not name.startswith("_"))


def _tests_text() -> str:
    tests = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "plugins").glob("*/tests/*.py")]
    return "\n".join(p.read_text() for p in tests)


def test_the_hook_list_is_not_empty():
    assert {"load", "predict", "explain", "complete", "embed", "metadata"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_docstring(hook):
    doc = getattr(hookspecs, hook).__doc__ or ""
    assert len(doc.strip()) > 40, f"hook {hook!r} needs a docstring saying when it is called and what it returns"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_docs_section(hook):
    assert f"### `{hook}`" in DOCS, f"docs/hooks.md has no section for hook {hook!r}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_implemented_by_some_test(hook):
    pattern = re.compile(r"@servekit\.hookimpl(\([^)]*\))?\s*\n\s*def " + re.escape(hook) + r"\(")
    assert pattern.search(_tests_text()), f"no test implements hook {hook!r}"


def _docs_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS, flags=re.S)


@pytest.mark.parametrize("index", range(len(_docs_examples())))
def test_docs_examples_run(index):
    code = _docs_examples()[index]
    namespace: dict = {"__name__": f"docs_example_{index}"}
    exec(compile(code, f"docs/hooks.md example {index}", "exec"), namespace)
    # every decorated function in the example is a hook pluggy accepts
    pm = plugins.new_manager()
    for value in list(namespace.values()):
        if isinstance(value, type) and value.__module__ == namespace["__name__"]:
            pm.register(value())
    module = type(
        "Example", (), {k: staticmethod(v) for k, v in namespace.items() if callable(v) and hasattr(v, "servekit_impl")}
    )
    pm.register(module)
