"""The shell examples of the docs, run as written (issue 45): every ``datamask ...`` line of
docs/incremental.md's ``bash`` blocks, in order, through the real command, on small
generated files under the names the docs use. Only ``--n-epochs`` (and ``--no-progress``
where the command has it) is added, to keep the learner short; a command the docs show
must never be refused.

The docs' own precondition is made first: the last dump's selection, one file
(``out/old_sel.parquet``) and sharded (``out/old_sel``, a folder the sharded example
passes as ``--given-selection``).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.cli import main
from tests._data import ROOT

DOCS = ["incremental.md"]
DIM = 4


def shell_commands(doc: Path) -> list[list[str]]:
    """Every ``datamask`` command of the doc's ``bash`` blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["datamask"]:
                commands.append(words[1:])
    return commands


def _table(n: int, first: int, seed: int) -> pa.Table:
    c = make_clustered(n, DIM, 5, seed=seed)
    x = np.asarray(c.features, np.float32)
    return pa.table(
        {
            "chunk_id": np.arange(first, first + n),
            "quality_score": c.quality[:, 0],
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), DIM),
        }
    )


def _fast(argv: list[str]) -> list[str]:
    extra = ["--n-epochs", "3", "--no-progress"] if argv[0] == "select" else []
    return [*argv, *extra]


@pytest.fixture
def dumps(tmp_path, monkeypatch):
    """The files the docs name: new_dump (5,200 rows: the docs ask for --k 5000), old_dump
    and kept, one file each and as folders of shards, and the old dump's selections."""
    monkeypatch.chdir(tmp_path)
    new, old = _table(5200, 0, seed=1), _table(1500, 100_000, seed=2)
    pq.write_table(new, "new_dump.parquet")
    pq.write_table(old, "old_dump.parquet")
    pq.write_table(old.slice(0, 300), "kept.parquet")
    os.makedirs("new_dump")
    os.makedirs("old_dump")
    for i in range(2):
        pq.write_table(new.slice(i * 2600, 2600), f"new_dump/part-{i}.parquet")
        pq.write_table(old.slice(i * 750, 750), f"old_dump/part-{i}.parquet")
    for argv in (
        ["select", "--input", "old_dump.parquet", "--output", "out/old_sel.parquet"],
        ["select", "--input", "old_dump/", "--output", "out/old_sel"],
    ):
        assert main(_fast([*argv, "--select-ratio", "0.1"])) == 0
    return tmp_path


@pytest.mark.slow  # two sharded runs on the local pool: about 20 s on 2 shared cores
@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_shell_examples_run_as_written(dumps, doc, capsys):
    commands = shell_commands(ROOT / "docs" / doc)
    assert len(commands) >= 4  # the blocks were found
    for argv in commands:
        code = main(_fast(argv))
        err = capsys.readouterr().err
        assert code == 0, f"datamask {shlex.join(argv)}\n{err}"
    # the sharded example read the sharded selection's selected/ parts as KEPT
    assert (dumps / "out" / "new_sel" / "manifest.json").exists()
