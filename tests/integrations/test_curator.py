"""datamask inside NeMo Curator: Curator's own writer makes the input, a real Curator
executor on a local Ray runs the workflow, and its selection is ``datamask select``'s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("nemo_curator")

import datamask  # noqa: E402
from datamask.io.keep import read_selected_ids  # noqa: E402
from tests._data import ROOT, SHIPPED_DEMO  # noqa: E402

SRC = str(Path(datamask.__file__).resolve().parents[1])  # this checkout, for every worker
EXAMPLE_DIR = ROOT / "examples" / "curator"  # curator_pipeline.py: PreEmbedded, the example
N_SHARDS = 4


def _title(proc: Path) -> str:
    """A process's title (``/proc/PID``): the first word of its command line, which Ray
    rewrites to ``ray::...`` and ``exec -a`` sets."""
    return (proc / "cmdline").read_bytes().split(b"\0")[0].decode()


def _leftovers(folder: Path, grace: float = 15.0) -> list[str]:
    """Titles of the Ray processes started from ``folder`` (their working directory) still
    alive ``grace`` seconds after the command that started them ended."""
    if not Path("/proc").is_dir():  # Linux's process table; elsewhere nothing to read
        return []
    deadline = time.monotonic() + grace
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                inside = Path(os.readlink(proc / "cwd")).is_relative_to(folder)
                title = _title(proc)
            except (OSError, ValueError):  # not a process, ended meanwhile, or not ours
                continue
            if inside and title.startswith("ray::"):
                found.append(f"{proc.name} {title}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


@pytest.mark.slow  # starts Ray (in a fresh interpreter: no Ray state of other tests)
def test_example_pipeline_equals_datamask_select(tmp_path):
    """examples/curator/curator_pipeline.py end to end on its own local Ray: Curator's
    ParquetWriter writes the embeddings, the workflow runs every datamask step through
    Xenna, Curator's removal workflow drops the rest. Then, here: the files Curator wrote
    are read by the ``curator`` preset with no conversion, the workflow's selection is
    ``datamask select``'s on the same files and seed, and exactly it was kept."""
    from datamask.cli import main

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([SRC, str(EXAMPLE_DIR)])
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE_DIR / "curator_pipeline.py"), "--input", str(SHIPPED_DEMO),
         "--work", str(work), "--cpus", "2", "--shards", str(N_SHARDS)],
        capture_output=True, text=True, env=env, timeout=580, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _leftovers(tmp_path) == [], "the example left Ray processes behind"
    summary = json.loads(proc.stdout[proc.stdout.rindex("{\n") :])  # the printed summary
    assert summary["executor"] == "XennaExecutor"
    assert {"ScanShard", "_removal_ids_step"} <= set(summary["steps"])  # every phase in Curator

    # What Curator's embedding stage and ParquetWriter wrote: a list column of doubles.
    emb = work / "embeddings"
    files = sorted(emb.glob("*.parquet"))
    assert len(files) == N_SHARDS
    schema = pq.read_schema(files[0])
    assert pa.types.is_list(schema.field("embeddings").type)
    cols = datamask.Columns(preset="curator", id_col="chunk_id").resolve(schema.names)
    assert (cols.quality_cols, cols.feature_col) == (("fineweb-edu-score-float",), "embeddings")

    # The workflow's selection is the CLI's on the same files with the same seed.
    cli_out = tmp_path / "cli"
    argv = ["select", "--input", str(emb), "--output", str(cli_out), "--preset", "curator",
            "--id-col", "chunk_id", "--select-ratio", "0.1", "--seed", "0", "--workers", "2",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    expected = np.sort(read_selected_ids(cli_out, "chunk_id").to_numpy(zero_copy_only=False))
    got = np.sort(read_selected_ids(work / "datamask" / "selection", "chunk_id").to_numpy(False))
    assert len(expected) == round(0.1 * 3000)
    np.testing.assert_array_equal(got, expected)

    # The ids to remove: every other id, one `id` column; Curator kept exactly the selection.
    parts = sorted((work / "datamask" / "ids_to_remove").glob("part.*.parquet"))
    removed = pa.concat_tables([pq.read_table(p) for p in parts])
    assert removed.column_names == ["id"]
    all_ids = pq.read_table(emb, columns=["chunk_id"]).column("chunk_id").to_numpy(False)
    np.testing.assert_array_equal(
        np.sort(removed.column("id").to_numpy(zero_copy_only=False)),
        np.setdiff1d(all_ids, expected),
    )
    kept = pq.read_table(work / "kept")
    np.testing.assert_array_equal(
        np.sort(kept.column("chunk_id").to_numpy(zero_copy_only=False)), expected
    )
    assert {"chunk_id", "text", "quality_score"} <= set(kept.column_names)  # every column kept


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_clusters_leftover_workers_are_killed_and_nothing_else(tmp_path):
    """``_end_leftovers(root)`` kills the processes titled ``ray::`` that carry ``root`` as
    their ``RAY_TMPDIR``; another cluster's worker and a process of ``root`` not titled
    ``ray::`` live on. Real processes (``exec -a`` sets the title), read from ``/proc``."""
    from datamask.integrations.curator import _end_leftovers

    root, other = tmp_path / "dmcur-a", tmp_path / "dmcur-b"
    sleep = "import time; time.sleep(120)"

    def start(title: str, tmpdir: Path) -> subprocess.Popen:
        env = {**os.environ, "RAY_TMPDIR": str(tmpdir)}
        cmd = ["bash", "-c", f'exec -a "{title}" "{sys.executable}" -c "{sleep}"']
        return subprocess.Popen(cmd, env=env)

    procs = [start(*a) for a in [("ray::Monitor", root), ("ray::Monitor", other), ("me", root)]]
    try:
        deadline = time.monotonic() + 10  # until exec has retitled the first
        while not _titled(procs[0].pid, "ray::Monitor"):
            assert time.monotonic() < deadline, "the process never took its title"
            time.sleep(0.05)
        _end_leftovers(str(root))
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        assert procs[1].poll() is None and procs[2].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _titled(pid: int, title: str) -> bool:
    try:
        return _title(Path(f"/proc/{pid}")) == title
    except (OSError, ValueError):  # not started yet, or ended
        return False


def test_bad_arguments_are_refused_at_the_door(tmp_path):
    from datamask.integrations.curator import CuratorRunner, DatamaskSelectionWorkflow

    one_of = "give one of select_ratio, k, budget_tokens, select_token_ratio; got "
    with pytest.raises(ValueError, match=one_of + "select_ratio=0.1, k=5, budget_tokens=None"):
        DatamaskSelectionWorkflow(str(tmp_path), str(tmp_path / "o"), select_ratio=0.1, k=5)
    with pytest.raises(ValueError, match=one_of):
        DatamaskSelectionWorkflow(str(tmp_path), str(tmp_path / "o"))
    with pytest.raises(TypeError, match="executor must be a Curator executor .* got LocalRunner"):
        CuratorRunner(datamask.distributed.LocalRunner())
    from nemo_curator.backends.xenna import XennaExecutor

    for bad in (0, 2.0, True):  # the one check of every runner (executors.check_workers)
        with pytest.raises(ValueError, match=f"workers must be a positive integer; got {bad}"):
            CuratorRunner(XennaExecutor(), workers=bad)
    wf = DatamaskSelectionWorkflow(
        str(tmp_path), str(tmp_path / "o"), k=5, quality_fields="q", lamb=0.3, method="topk"
    )
    assert wf.select_settings() == {
        "preset": "curator", "id_col": "id", "feature_col": "embeddings", "seed": 0,
        "progress": False, "quality_col": ["q"], "k": 5, "lamb": 0.3, "method": "topk",
    }  # fmt: skip
    wf = DatamaskSelectionWorkflow(
        str(tmp_path), str(tmp_path / "o"), select_token_ratio=0.1, length_field="text"
    )
    assert wf.select_settings()["select_token_ratio"] == 0.1
    assert wf.select_settings()["length_col"] == "text"
