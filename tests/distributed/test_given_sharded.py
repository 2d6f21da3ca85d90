"""``select --given KEPT`` on sharded input: floors, the union's J, cover, errors, resume.

Against brute force on small generated shards and the one-file ``--given`` run, with the
real local process pool (one per module, ``local_pool``, but for the CLI test's own), and Ray in
the slow resume test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import datamask
from datamask.config import SelectSpec
from datamask.distributed import run_selection
from datamask.distributed.paths import WorkDir
from datamask.distributed.plan.partition import Group, plan_by_chunk
from datamask.distributed.select.given import group_floor
from datamask.distributed.select.steps import read_group
from datamask.io.shards import inspect_shards
from tests._data import reference_table, write

#: every test here runs a sharded select with the local process pool (or kills a run)
pytestmark = pytest.mark.slow

LAMB = 0.5
N_KEPT, N_NEW, DIM = 60, 200, 8


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """KEPT (ids 10000+), the new documents as one file and as 4 shards (ids 0+)."""
    root = tmp_path_factory.mktemp("given_sharded")
    rng = np.random.default_rng(0)
    xk, xn = _unit(rng.normal(size=(N_KEPT, DIM))), _unit(rng.normal(size=(N_NEW, DIM)))
    qk, qn = rng.random(N_KEPT) * 3, rng.random(N_NEW) * 3 + 1
    kept = write(reference_table(np.arange(10_000, 10_000 + N_KEPT), qk, xk), root / "kept.parquet")
    new = write(reference_table(np.arange(N_NEW), qn, xn), root / "new.parquet")
    step = N_NEW // 4
    for i in range(4):
        rows = slice(i * step, (i + 1) * step)
        table = reference_table(np.arange(N_NEW)[rows], qn[rows], xn[rows])
        write(table, root / "shards" / f"{i:02d}.parquet")
    return {"root": root, "kept": kept, "new": new, "shards": root / "shards"} | {
        "xk": xk,
        "qk": qk,
        "xn": xn,
        "qn": qn,
    }


def _union_j(d: dict, chosen: list[int]) -> float:
    """J of KEPT ∪ chosen over every document of KEPT and the input, by brute force."""
    x = np.concatenate([d["xk"], d["xn"]]).astype(np.float64)
    q = np.concatenate([d["qk"], d["qn"]])
    q = (q - q.min()) / (q.max() - q.min())
    sel = list(range(N_KEPT)) + [N_KEPT + j for j in chosen]
    return LAMB * q[sel].mean() + (1 - LAMB) * np.clip((x @ x[sel].T).max(1), 0, None).mean()


def _chosen_file(path: Path) -> list[int]:
    table = pq.read_table(path)
    return sorted(table.filter(table["selected"])["chunk_id"].to_pylist())


def _chosen_dir(out: Path) -> list[int]:
    return sorted(pq.read_table(out / "selected")["chunk_id"].to_pylist())


def test_one_group_selects_as_the_one_file_run_with_brute_force_floors(data, tmp_path, local_pool):
    kw = dict(given=data["kept"], k=20, method="greedy-dense", progress=False)
    one = datamask.select(data["new"], tmp_path / "one.parquet", **kw)
    out = tmp_path / "sharded"
    sharded = datamask.select(
        data["shards"], out, partition="chunk", chunk_size=1000, scheduler=local_pool, **kw
    )
    assert sharded["totals"]["n_groups"] == 1
    chosen = _chosen_dir(out)
    assert chosen == _chosen_file(tmp_path / "one.parquet")
    assert _union_j(data, chosen) == pytest.approx(one["terms_union"]["J"], abs=1e-5)
    # the floors: every row's best cosine to KEPT, as a group step sets them
    brute = np.clip((data["xn"] @ data["xk"].T).max(1), 0, None)
    given = sharded["given"]
    assert given["floor"]["mean"] == pytest.approx(brute.mean(), abs=1e-6)
    assert (given["n_docs"], given["n_kept"], given["floor"]["method"]) == (60, 60, ["exact"])
    assert given["quality_range"] == one["given"]["quality_range"]
    assert sharded["provenance"]["given"]["files"]
    files = sorted(data["shards"].glob("*.parquet"))
    settings = SelectSpec.from_mapping({"given": str(data["kept"])})
    names = pq.read_schema(files[0]).names
    settings = settings.evolve(columns=settings.columns.resolve(names, where="shards"))
    infos = inspect_shards(files, columns=settings.read_columns)
    for label, pieces in plan_by_chunk(infos, 50):
        spec = Group(gid=0, label=label, pieces=tuple(pieces), k=1, seed=0)
        corpus, ids = read_group(spec, settings)
        group_floor(corpus, settings, WorkDir.of(out))
        want = brute[np.asarray(ids.to_pylist())]
        np.testing.assert_allclose(corpus.floor, want, atol=1e-6)


@pytest.mark.parametrize(
    "partition",
    [
        dict(partition="cluster", n_clusters=4, chunk_size=60, budget="global"),  # gains
        dict(partition="chunk", chunk_size=60, budget="global"),  # central round
        dict(partition="chunk", chunk_size=60, budget="group"),  # a share per group
    ],
)
def test_many_groups_select_only_new_documents_near_the_one_file_union_j(
    data, tmp_path, partition, local_pool
):
    kw = dict(given=data["kept"], k=20, method="greedy-dense", progress=False)
    one = datamask.select(data["new"], tmp_path / "one.parquet", **kw)
    out = tmp_path / "sharded"
    sharded = datamask.select(data["shards"], out, **kw, **partition, scheduler=local_pool)
    assert sharded["totals"]["n_groups"] > 1
    chosen = _chosen_dir(out)
    assert len(chosen) == 20 and set(chosen) <= set(range(N_NEW))  # from the input only
    assert _union_j(data, chosen) >= one["terms_union"]["J"] - 0.01
    # without --given the same shards select for the input alone: the union J is lower
    alone = datamask.select(
        data["shards"], tmp_path / "alone", k=20, method="greedy-dense", progress=False,
        scheduler=local_pool, **partition,
    )  # fmt: skip
    assert alone["totals"]["k"] == 20  # --k on shards: exactly k
    assert _union_j(data, chosen) >= _union_j(data, _chosen_dir(tmp_path / "alone")) - 1e-9


def test_cover_names_a_kept_document_where_it_is_nearer(data, tmp_path, local_pool):
    out = tmp_path / "sharded"
    datamask.select(
        data["shards"],
        out,
        given=data["kept"],
        k=20,
        method="greedy-dense",
        partition="chunk",
        chunk_size=60,
        budget="group",
        progress=False,
        scheduler=local_pool,
    )
    cover = pq.read_table(out / "covered").to_pandas().sort_values("chunk_id")
    chosen = _chosen_dir(out)
    # brute force over KEPT ∪ S: 4 groups, every other group searched, exact searches
    ids = np.concatenate([np.arange(10_000, 10_000 + N_KEPT), np.asarray(chosen)])
    base = np.concatenate([data["xk"], data["xn"][chosen]])
    sims = data["xn"] @ base.T
    dropped = ~cover["selected"].to_numpy()
    best = sims.max(1)[dropped]
    np.testing.assert_allclose(cover["covered_sim"].to_numpy()[dropped], best, atol=1e-5)
    named = cover["covered_by"].to_numpy()[dropped]
    assert (named == ids[sims.argmax(1)[dropped]]).mean() > 0.99  # float ties aside
    assert (named >= 10_000).any() and (named < 10_000).any()
    assert cover["covered_exact"].all()


def test_bad_given_on_shards_is_refused_with_nothing_written(data, tmp_path, local_pool):
    root = tmp_path
    overlap = write(
        reference_table([10_001, 7], data["qk"][:2], data["xk"][:2]), root / "o.parquet"
    )
    wide = write(reference_table([20_001, 20_002], [1.0, 2.0], np.eye(2, 7)), root / "w.parquet")
    cases = [
        (
            {"given": overlap},
            r"chunk_id 7 occurs more than once \(row 7 of .*00.parquet and "
            r"row 1 of .*o.parquet.*unique across --given and --input",
        ),
        ({"given": wide}, r"embedding width 7 in .*w.parquet does not match 8"),
        ({"given": data["kept"], "k": 201}, r"k must be at most the 200 documents"),
        ({"given": data["kept"], "algorithm": ["Pair_simi"]}, r"Use --algorithm Facility"),
        (
            {"given": data["kept"], "given_selection": str(data["new"])},
            r"--given-selection .* not",
        ),
    ]
    out = root / "out"
    for settings, match in cases:
        with pytest.raises(ValueError, match=match):
            datamask.select(
                data["shards"], out, progress=False, partition="chunk", scheduler=local_pool,
                **settings,
            )  # fmt: skip
        assert not out.exists(), (settings, list(out.rglob("*")))


# --- resume ---------------------------------------------------------------------------------
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import datamask.distributed.engine as engine
    from datamask.config import SelectSpec
    from datamask.distributed import run_selection

    real = engine.atomic_write_json  # every step's marker
    markers = []

    def write_then_die(obj, path):
        if "completions" in str(path) and path.name != "given":
            markers.append(path)
            if len(markers) == 2:  # group 1's files in place, its marker not
                os.kill(os.getpid(), signal.SIGKILL)
        real(obj, path)

    engine.atomic_write_json = write_then_die
    settings = SelectSpec.from_mapping({settings!r})
    run_selection(sys.argv[1], sys.argv[2], settings, progress=False)
    """
)


@pytest.mark.slow
def test_a_killed_given_run_resumes_to_the_same_selection(data, tmp_path):
    pytest.importorskip("ray")
    from datamask.distributed import RayRunner

    settings = dict(
        given=str(data["kept"]),
        k=20,
        method="greedy-dense",
        partition="cluster",
        n_clusters=4,
        chunk_size=60,
        budget="global",
    )
    spec = SelectSpec.from_mapping(settings)
    clean = run_selection(data["shards"], tmp_path / "clean", spec, progress=False)
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(settings=settings))
    out = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, str(script), str(data["shards"]), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    runner = RayRunner(workers=2)  # starts Ray; close() stops it and restores os.environ
    try:
        resumed = run_selection(data["shards"], out, spec, runner=runner, progress=False)
    finally:
        runner.close()
    assert resumed["totals"]["groups_reused"] >= 1
    assert _chosen_dir(out) == _chosen_dir(tmp_path / "clean")
    assert resumed["given"]["floor"]["mean"] == pytest.approx(clean["given"]["floor"]["mean"])


def test_cli_select_given_on_shards_and_its_one_line_error(data, tmp_path, capsys):
    from datamask.cli import main

    argv = ["select", "--input", str(data["shards"]), "--given", str(data["kept"])]
    argv += ["--k", "7", "--method", "greedy-dense", "--no-progress", "--workers", "2"]
    assert main([*argv, "--output", str(tmp_path / "sel")]) == 0
    manifest = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert manifest["totals"]["k"] == 7 and manifest["given"]["n_kept"] == N_KEPT
    assert manifest["terms_union"] is None
    assert "J" not in (manifest["terms"] or {})  # KEPT covers too: the cover gives no J
    capsys.readouterr()
    overlap = write(reference_table([3], [1.0], data["xk"][:1]), tmp_path / "o.parquet")
    bad = ["select", "--input", str(data["shards"]), "--given", str(overlap), "--k", "7"]
    assert main([*bad, "--no-progress", "--output", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unique across --given and --input" in err[0]
    assert not (tmp_path / "bad").exists()
