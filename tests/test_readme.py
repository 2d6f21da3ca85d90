"""The README's flag tables and the generated parser name the same flags of ``select``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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


def test_readme_tables_list_every_select_flag_and_no_other():
    text = README.read_text()
    start = text.index("### `datamask select` flags")
    stop = text.index("## From text to embeddings")  # past the sharded-selection table
    tables = _table_flags(text[start:stop])
    flags = _select_flags()
    assert flags - tables == set(), "flags of `datamask select` missing from the README"
    assert tables - flags == set(), "README tables name flags `datamask select` lacks"
