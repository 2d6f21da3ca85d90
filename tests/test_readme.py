"""The CLI reference (docs/cli.md) and the generated parser name the same flags of ``select``;
the README stays a short guide whose links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_REFERENCE = ROOT / "docs" / "cli.md"


_FLAGS = """
from datamask.cli import build_parser
select = build_parser()._subparsers._group_actions[0].choices["select"]
for action in select._actions:
    for flag in action.option_strings:
        if flag.startswith("--") and "_" not in flag and flag != "--help":
            print(flag)
"""


def _select_flags() -> set[str]:
    """The flags of a fresh process: user terms other tests registered add their own."""
    done = subprocess.run([sys.executable, "-c", _FLAGS], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def _table_flags(text: str) -> set[str]:
    """Flags in the first cell of table rows, e.g. ``| `--max-lr`, `--max_lr` / ... |``."""
    found = set()
    for line in text.splitlines():
        if line.startswith("| `--"):
            first = line.split("|")[1]
            found |= {f for f in re.findall(r"`(--[a-z][a-z0-9_-]*)", first) if "_" not in f}
    return found


@pytest.mark.slow
def test_cli_reference_lists_every_select_flag_and_no_other():
    text = CLI_REFERENCE.read_text()
    start = text.index("## `datamask select` flags")
    end = text.find("\n## `datamask ", start + 1)  # the other commands' tables follow
    tables = _table_flags(text[start:end])  # the select table and the sharded-run table
    flags = _select_flags()
    assert flags - tables == set(), "flags of `datamask select` missing from docs/cli.md"
    assert tables - flags == set(), "docs/cli.md tables name flags `datamask select` lacks"


def test_readme_is_a_short_guide_in_order():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections == [
        "## From text to a filtered corpus: four commands",
        "## See what was kept: `datamask report`",
        "## Python API",
        "## Concepts",
        "## Layout",
        "## Results",
    ]
    # exactly two set-up commands first, the second being what CI runs
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(first_block) == 2
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == first_block[1]


def test_relative_links_in_readme_and_docs_resolve():
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert missing == []
