"""A new user's first hour, in a fresh virtualenv that has no servekit and no index that holds it.

The virtualenv sees the suite's own packages (scikit-learn, pytest, tritonclient...) through
a ``.pth`` line, as ``--system-site-packages`` would from a Python that has them, but not
servekit: each servekit entry of this site-packages is left out.  pip runs with no
configuration and no index (``PIP_NO_INDEX``), so anything servekit the commands need must come
from the files they name, and nothing is downloaded.

Then the commands are the ones the user reads: the generated container's README, block by
block, in its order (install, train, test, serve, call it with curl and with the Python
snippet), and every ``pip install`` the repository's README and docs give.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from processes import wait_ready
from repo_paths import REPO
from servekit.scaffold import project as scaffold
from servekit.testing import free_port

pytestmark = pytest.mark.slow  # a virtualenv, pip, servers

SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
#: Markdown files whose install commands a new user copies.
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Pages whose ``pip install -e ".[test]"`` installs the plugin package a page builds, not servekit.
NOT_FROM_THE_CLONE = {"writing-plugins.md"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _is_servekit(entry: Path) -> bool:
    name = entry.name.lower()
    return name.startswith(("servekit", "__editable__", "_servekit"))


@pytest.fixture(scope="module")
def suite_packages(tmp_path_factory) -> Path:
    """This site-packages without servekit: a folder of links to everything else."""
    packages = tmp_path_factory.mktemp("packages")
    for entry in SITE_PACKAGES.iterdir():
        if not _is_servekit(entry):
            (packages / entry.name).symlink_to(entry)
    return packages


def make_venv(venv: Path, packages: Path) -> Path:
    """A new virtualenv that sees ``packages`` (as ``--system-site-packages`` would) and not servekit."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=fresh_env(venv),
        ).stdout.strip()
    )
    (site / "suite-packages.pth").write_text(f"import site; site.addsitedir({str(packages)!r})\n")
    # a Python before 3.12 seeds an old setuptools that would hide the suite's (servekit needs 77)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "setuptools"],
        env=fresh_env(venv),
        capture_output=True,
        timeout=300,
    )
    return venv


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, suite_packages) -> Path:
    """One for the tests that only resolve (``--dry-run``): nothing is ever installed into it."""
    return make_venv(tmp_path_factory.mktemp("fresh") / "venv", suite_packages)


def fresh_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell in the fresh virtualenv: no PYTHONPATH, no pip configuration, no index."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(sys.prefix)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH", "VIRTUAL_ENV"))}
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), *path]),
        VIRTUAL_ENV=str(venv),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        **extra,
    )
    return env


def shell(command: str, venv: Path, cwd: Path, timeout: float = 600, **extra: str) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=cwd,
        env=fresh_env(venv, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def sections(readme: str) -> dict[str, list[tuple[str, str]]]:
    """``{heading: [(language, code), ...]}`` of a Markdown file's ``##`` sections."""
    found: dict[str, list[tuple[str, str]]] = {}
    for part in re.split(r"^## ", readme, flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        found[heading.strip()] = FENCE.findall(body)
    return found


def commands(code: str) -> list[str]:
    """The command lines of a bash block (continuations joined)."""
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def test_the_fresh_virtualenv_has_no_servekit(fresh_venv, tmp_path):
    probe = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", "import sklearn, servekit"],
        env=fresh_env(fresh_venv),
        capture_output=True,
        text=True,
    )
    assert "No module named 'servekit'" in probe.stderr, probe.stderr


def test_a_generated_container_s_readme_runs_in_order(suite_packages, tmp_path):
    fresh_venv = make_venv(tmp_path / "venv", suite_packages)  # its own: the README installs servekit into it
    made = subprocess.run(
        [sys.executable, "-m", "servekit", "new", "--no-input", "--output-dir", str(tmp_path)]
        + ["--set", "project_name=Fresh Iris", "--set", "framework=sklearn"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    project = tmp_path / "fresh-iris"
    readme = sections((project / "README.md").read_text())
    assert "pypi.org" not in (project / "README.md").read_text()  # servekit has no package page

    # Run it locally: install, train, test, then serve (in the background, on free ports).
    local = [line for lang, code in readme["Run it locally"] if lang == "bash" for line in commands(code)]
    assert [line.split()[0] for line in local] == ["pip", "python", "python", "servekit"], local
    http, grpc = free_port(), free_port()
    for line in local[:-1]:
        shell(line, fresh_venv, project)
    assert (project / "1").is_dir()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            ["bash", "-c", "exec " + local[-1]],
            cwd=project,
            env=fresh_env(fresh_venv, SERVEKIT_HTTP_PORT=str(http), SERVEKIT_GRPC_PORT=str(grpc)),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(f"http://127.0.0.1:{http}", server, log)
        # Call it: every curl line, then the Python snippet, against that server.
        answers = []
        for lang, code in readme["Call it"]:
            code = code.replace("localhost:8080", f"127.0.0.1:{http}")
            if lang == "bash":
                answers += [shell(line, fresh_venv, project, timeout=120) for line in commands(code)]
            elif lang == "python":
                snippet = tmp_path / "snippet.py"
                snippet.write_text(code)
                printed = shell(f"python {snippet}", fresh_venv, project, timeout=120)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert any('"predictions"' in a for a in answers) and any('"outputs"' in a for a in answers), answers
    assert "setosa" in printed  # V1 through requests
    # tritonclient's binary outputs, decoded by as_numpy: the labels themselves, not only names and shapes
    assert re.search(r"^label \[.*setosa", printed, re.MULTILINE), printed


def pip_installs(text: str) -> list[str]:
    """``pip install`` commands of servekit (a code span's or a line's own, not a quoted message), as written."""
    found = re.findall(r"(?:^|`)(pip install [^`\n]*(?:servekit|\.\[|\.whl)[^`\n]*)", text, re.MULTILINE)
    return [command.split("  #")[0].split(" && ")[0].strip() for command in found]


def test_no_page_installs_servekit_from_an_index():
    offenders = {
        f"{path.name}: {command}"
        for path in DOC_FILES
        for command in pip_installs(path.read_text())
        if re.search(r"""(^|\s)["']?servekit(\[|["']?(\s|$))""", command.removeprefix("pip install"))
    }
    assert not offenders, sorted(offenders)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The clone's files, copied: pip builds in the tree it installs from, and the checkout stays clean."""
    return scaffold._source_copy(REPO, tmp_path_factory.mktemp("clone") / "servekit")


def test_every_install_command_of_the_docs_works_from_the_clone(fresh_venv, clone):
    """Resolved for real (``--dry-run``): servekit from the clone, its dependencies already here."""
    tried = set()
    for path in DOC_FILES:
        if path.name in NOT_FROM_THE_CLONE:
            continue
        for command in pip_installs(path.read_text()):
            if "servekit-" in command or "-r requirements" in command or command in tried:
                continue  # a built wheel (the next test) or a generated project (the test above)
            tried.add(command)
            out = shell(command + " --dry-run --no-build-isolation", fresh_venv, clone, timeout=300)
            assert "Would install" in out and "servekit-" in out, f"{path.name}: {command}\n{out}"
    assert len(tried) >= 3, tried


def test_the_wheel_the_readme_builds_installs_with_its_extras(fresh_venv, clone, tmp_path):
    """The README's two wheel commands: ``pip wheel`` in the clone (into a folder of the test's), then
    ``pip install dist/servekit-...whl[extra]`` resolved (``--dry-run``) where there is no clone."""
    readme = (REPO / "README.md").read_text()
    build = re.search(r"^pip wheel --no-deps -w dist \.", readme, re.MULTILINE)
    assert build, "the README builds a wheel with: pip wheel --no-deps -w dist ."
    shell(f"pip wheel --no-deps --no-build-isolation -q -w {tmp_path / 'dist'} .", fresh_venv, clone)
    installs = [c for path in DOC_FILES for c in pip_installs(path.read_text()) if "dist/servekit-" in c]
    assert installs, "no page installs the built wheel"
    for command in installs:
        out = shell(command + " --dry-run", fresh_venv, tmp_path, timeout=300)
        assert "Would install servekit-" in out, f"{command}\n{out}"
