"""The benchmark scripts run at HEAD: each answers ``--help``, and none imports a private
module or name of datamask (what a script may rely on is the public API, so a refactor of
the library's insides cannot silently break a benchmark). Scripts are found by glob, so a
new benchmark folder is covered without being listed here; ``benchmarks/archive/`` holds
scripts tied to one past experiment and is exempt (its README says what each measured)."""

from __future__ import annotations

import ast
import json
import os
import re
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
        "from datamask.embedding import _load_model, embed_texts\n"
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


#: Runs each script given with ``--help`` as ``python SCRIPT --help`` would, in a child
#: forked from one interpreter that imported what they share (torch, pyarrow, datamask)
#: once: a fresh interpreter per script cost 2.4-3.6 s each, 79 s for the 30 of them.
#: Prints ``{script: [exit code, stdout and stderr]}`` as JSON.
_HELP_EACH = """
import json, os, runpy, sys, traceback
import numpy, pyarrow, pyarrow.parquet, torch, datamask, datamask.cli  # shared, once
answers = {}
for path in sys.argv[1:]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the script as __main__, its folder first on sys.path
        os.close(read_end)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        sys.argv, sys.path[0] = [path, "--help"], os.path.dirname(path)
        code = 0
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8", errors="replace") as pipe:
        output = pipe.read()
    _, status = os.waitpid(pid, 0)
    answers[path] = [os.waitstatus_to_exitcode(status), output]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def help_answers() -> dict[str, list]:
    """Every script's answer to ``--help`` (:data:`_HELP_EACH`), from the repository root
    with this checkout's ``src`` first."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", _HELP_EACH, *map(str, SCRIPTS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow  # the scripts' imports: about 10 s for all of them
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks one child per script")
@pytest.mark.parametrize("path", SCRIPTS, ids=_name)
def test_every_benchmark_script_answers_help_at_head(path, help_answers):
    code, output = help_answers[str(path)]
    assert code == 0, f"{_name(path)} --help failed:\n{output[-2000:]}"
    assert "usage:" in output, output[:500]


# --- the index: benchmarks/README.md has one row per folder ---------------------------------
INDEX = BENCHMARKS / "README.md"
#: A row of the index's table: its first cell names one folder, as `name/`.
INDEX_ROW = re.compile(r"^\|\s*`([^`/]+)/`\s*\|", re.MULTILINE)


def study_folders(root: Path = BENCHMARKS) -> set[str]:
    """The folders of ``benchmarks/`` (hidden and cache folders aside)."""
    return {
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and p.name != "__pycache__"
    }


def index_rows(readme: str) -> list[str]:
    """The folders the index's rows name, in order (a folder named twice is listed twice)."""
    section = readme.split("## Index", 1)[1].split("\n## ", 1)[0] if "## Index" in readme else ""
    return INDEX_ROW.findall(section)


def index_problems(root: Path = BENCHMARKS) -> list[str]:
    """What is wrong between ``root``'s folders and its README's index."""
    rows = index_rows((root / "README.md").read_text())
    folders = study_folders(root)
    problems = [f"{name}/ has no row in the index" for name in sorted(folders - set(rows))]
    problems += [
        f"the index names {name}/, which does not exist" for name in rows if name not in folders
    ]
    problems += [f"{name}/ has two rows" for name in sorted({n for n in rows if rows.count(n) > 1})]
    problems += [
        f"{name}/ has no RESULTS.md"
        for name in sorted(folders - {"archive"})
        if not (root / name / "RESULTS.md").is_file()
    ]
    return problems


def test_every_benchmark_folder_has_a_row_in_the_index_and_a_results_file():
    problems = index_problems()
    assert not problems, (
        f"benchmarks/README.md's index and benchmarks/ disagree: {problems}; give each folder "
        "one row (`name/` | what it measures | headline figure | its RESULTS.md) and a RESULTS.md."
    )


def test_the_index_check_catches_a_missing_row_a_stale_row_and_no_results(tmp_path):
    for name in ("a", "b", "archive"):
        (tmp_path / name).mkdir()
    (tmp_path / "a" / "RESULTS.md").write_text("# a\n")
    (tmp_path / "README.md").write_text(
        "# Benchmarks\n\n## Index\n\n| folder | what |\n|---|---|\n"
        "| `a/` | one study |\n| `gone/` | deleted |\n| `archive/` | old runs |\n\n## Other\n"
        "| `b/` | a row outside the index does not count |\n"
    )
    assert index_problems(tmp_path) == [
        "b/ has no row in the index",
        "the index names gone/, which does not exist",
        "b/ has no RESULTS.md",
    ]


def test_the_index_links_each_results_file_that_exists():
    readme = INDEX.read_text()
    for link in re.findall(
        r"\]\(([^)]+\.md)\)", readme.split("## Index", 1)[1].split("\n## ", 1)[0]
    ):
        assert (BENCHMARKS / link).resolve().is_file(), link
