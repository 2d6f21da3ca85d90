"""The benchmark scripts run at HEAD: each answers ``--help``, and none imports a private
module or name of datamask (what a script may rely on is the public API, so a refactor of
the library's insides cannot silently break a benchmark). Scripts are found by glob, so a
new benchmark folder is covered without being listed here; ``benchmarks/archive/`` holds
scripts tied to one past experiment and is exempt (its README says what each measured)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
ARCHIVE = BENCHMARKS / "archive"
SOURCES = sorted(p for p in BENCHMARKS.rglob("*.py") if ARCHIVE not in p.parents)
#: The scripts (a ``__main__`` block); the other files are modules they import.
SCRIPTS = [p for p in SOURCES if 'if __name__ == "__main__"' in p.read_text()]


def _name(path: Path) -> str:
    return str(path.relative_to(BENCHMARKS))


def private_imports(source: str) -> list[str]:
    """``datamask`` imports of ``source`` that reach a private module or name:
    ``import datamask._x``, ``from datamask._x import y``, ``from datamask.x import _y``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules, names = [node.module], [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "datamask":
                continue
            private = [p for p in parts[1:] if p.startswith("_")]
            private += [n for n in names if n.startswith("_") and n != "__version__"]
            if private:
                found.append(f"line {node.lineno}: {module} ({', '.join(private)})")
    return found


def test_the_private_import_check_catches_each_form():
    source = (
        "import datamask._device\nfrom datamask._memory import rss_mb\n"
        "from datamask.embed import _load_model, embed_texts\n"
        "from datamask.measure import cpu_seconds\nimport datamask\nfrom os import _exit\n"
    )
    assert [f.split(":")[0] for f in private_imports(source)] == ["line 1", "line 2", "line 3"]


def test_scripts_are_found():
    names = {_name(p) for p in SCRIPTS}
    assert {"realtext/run.py", "realtext/knn.py", "scale/run.py"} <= names
    assert not any(p.is_relative_to(ARCHIVE) for p in SCRIPTS)


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_no_benchmark_imports_a_private_module(path):
    found = private_imports(path.read_text())
    assert not found, (
        f"{_name(path)} imports private parts of datamask: {found}; use the public API "
        "(datamask.measure for threads, CPU seconds and memory), or move a script tied to one "
        "past experiment to benchmarks/archive/ with a line in its README."
    )


def test_every_archived_script_has_a_line_in_the_archive_readme():
    readme = (ARCHIVE / "README.md").read_text()
    for path in ARCHIVE.rglob("*.py"):
        assert f"`{path.relative_to(ARCHIVE)}`" in readme, path


@pytest.mark.slow  # a fresh interpreter per script (torch imports): about 3-5 s each
@pytest.mark.parametrize("path", SCRIPTS, ids=_name)
def test_every_benchmark_script_answers_help_at_head(path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, str(path), "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{_name(path)} --help failed:\n{done.stderr[-2000:]}"
    assert "usage:" in done.stdout, done.stdout[:500]
