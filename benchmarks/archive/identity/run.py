"""Issue 21's before/after identity check: every selection on the demo sets, before and after.

    python benchmarks/archive/identity/run.py                       # before 09fb092, after HEAD
    python benchmarks/archive/identity/run.py --before 09fb092 --after HEAD --jobs 2

Checks out ``--before`` and ``--after`` into temporary git worktrees under /tmp and, for
every registered selection method on every input, runs the user's command,
``python -m datamask.cli select ...`` (what the ``datamask`` script runs), in a subprocess
with ``PYTHONPATH=<tree>/src``, with the same explicit flags on both sides. Every setting
whose default moved by design is passed explicitly: the column names (issue 21 resolves
them from a preset), ``--partition`` (issue 18 made k-means groups the default) and
``--select-ratio``. It then compares the kept id sets. Where they differ, both sets are
scored by one evaluator, the after tree's
:func:`datamask.evaluate.scores.evaluate_selection` with the run's objective (its
``--algorithm`` and ``--lamb``), so J before and J after are measured alike; the overlap
is the number of kept ids in common.

Inputs: ``../shared/data/demo_docs.parquet`` (2,077 documents), the shipped
``examples/demo/demo_docs.parquet`` (3,000; the README's demo), and that demo cut into 4
contiguous shards, selected with ``--partition shard`` (a group per shard) and with
``--partition cluster --n-clusters 4`` (k-means groups). Writes ``RESULTS.md`` beside this
file (``--results`` to change), the kept ids and logs under ``--work`` (deleted unless
``--keep``). 32 minutes on 2 cores shared with other work (load average 6-9) with
``--jobs 2``; the sharded disf-greedy runs (2-4 minutes each) take the most.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[3]
SHARED_DEMO = REPO.parent / "shared" / "data" / "demo_docs.parquet"
EXAMPLES_DEMO = REPO / "examples" / "demo" / "demo_docs.parquet"
N_SHARDS = 4

#: (label, --method, --algorithm): every registered method, the learner with each term.
METHODS = [
    ("mask (Facility)", "mask", "Facility"),
    ("mask (Pair_simi)", "mask", "Pair_simi"),
    ("mask (DiSF)", "mask", "DiSF"),
    ("greedy", "greedy", "Facility"),
    ("greedy-dense", "greedy-dense", "Facility"),
    ("stochastic-greedy", "stochastic-greedy", "Facility"),
    ("disf-greedy", "disf-greedy", "DiSF"),
    ("topk", "topk", "Facility"),
    ("random", "random", "Facility"),
]
#: RESULTS.md keeps what follows this line when the tables are written again.
NOTES = "<!-- notes: written by hand, kept by run.py -->\n"
#: Methods that draw nothing: their selection must not move.
DETERMINISTIC = {"greedy", "greedy-dense", "topk"}


@dataclass(frozen=True)
class Input:
    name: str
    path: Path  # what select reads
    whole: Path  # the one file holding the same rows (for scoring)
    columns: tuple[str, str, str]  # id, quality, embedding
    flags: tuple[str, ...] = ()
    sharded: bool = False


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def cut_into_shards(src: Path, folder: Path, n: int) -> Path:
    """``src`` as ``n`` contiguous parquet shards (the sharded demo)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(src)
    rows = table.num_rows
    for i in range(n):
        lo, hi = i * rows // n, (i + 1) * rows // n
        pq.write_table(table.slice(lo, hi - lo), folder / f"part-{i:05d}.parquet")
    return folder


def select_args(inp: Input, method: str, algorithm: str, args: argparse.Namespace) -> list[str]:
    id_col, quality_col, feature_col = inp.columns
    return [
        "--input", str(inp.path),
        "--method", method,
        "--algorithm", algorithm,
        "--lamb", "0.5",
        "--select-ratio", str(args.select_ratio),
        "--seed", str(args.seed),
        "--device", "cpu",
        "--threads", "1",
        "--id-col", id_col,
        "--quality-col", quality_col,
        "--feature-col", feature_col,
        "--no-progress",
        *inp.flags,
    ]  # fmt: skip


def kept_ids(output: Path, id_col: str) -> list:
    """Sorted kept ids of a select output: a file with ``selected``, or a sharded folder."""
    files = sorted((output / "selected").glob("*.parquet")) if output.is_dir() else [output]
    ids: list = []
    for f in files:
        table = pq.read_table(f)
        if "selected" in table.column_names:
            table = table.filter(table.column("selected"))
        ids.extend(table.column(id_col).to_pylist())
    return sorted(ids)


def run_select(
    tree: Path, cli_args: list[str], output: Path, log: Path, shim: Path | None = None
) -> tuple[int, float]:
    path = [str(shim)] if shim is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(tree / "src")])}
    started = time.perf_counter()
    with log.open("w") as fh:
        fh.write("PYTHONPATH=" + env["PYTHONPATH"] + " python -m datamask.cli select ")
        fh.write(" ".join([*cli_args, "--output", str(output)]) + "\n")
        fh.flush()
        rc = subprocess.run(
            [sys.executable, "-m", "datamask.cli", "select", *cli_args, "--output", str(output)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=tree,
        ).returncode
    return rc, time.perf_counter() - started


SCORER = r"""
import json, sys
import numpy as np
from datamask.columns import Columns
from datamask.evaluation.scores import evaluate_selection
from datamask.io.parquet import read_corpus

job = json.load(open(sys.argv[1]))
id_col, quality_col, feature_col = job["columns"]
corpus = read_corpus(job["input"], Columns(id_col=id_col, quality_cols=(quality_col,),
                                           feature_col=feature_col))
row = {v: i for i, v in enumerate(corpus.ids.tolist())}
out = {}
for key, item in job["sets"].items():
    rows = np.array([row[v] for v in item["ids"]], dtype=np.int64)
    rep = evaluate_selection(corpus, rows, algorithm=item["algorithm"], lamb=0.5, dup_all=False)
    out[key] = rep["objective"]["J"]
json.dump(out, open(sys.argv[2], "w"))
"""


#: A ``sitecustomize`` that gives the after tree the seeding it had before issue 21: every
#: component seeds its generators with the run's (or group's) seed itself, not with its own
#: spawned stream. ``stream.entropy`` is that seed (every stream is a child of
#: ``SeedSequence(seed)``). If the after tree selects the before set with it, the difference
#: is the seeding and nothing else. Loaded by every process, the sharded workers included.
OLD_SEEDING = """
import numpy as np
import torch

import datamask._device
import datamask.base
import datamask.objectives.base


def make_generators(stream, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(int(stream.entropy))
    return gen, np.random.default_rng(int(stream.entropy))


for module in (datamask._device, datamask.base, datamask.objectives.base):
    module.make_generators = make_generators
"""


def score(tree: Path, inp: Input, sets: dict[str, dict], work: Path) -> dict[str, float]:
    """J of each kept set, scored by ``tree``'s evaluate_selection in one process."""
    if not sets:
        return {}
    job, result = work / f"score-{inp.name}.json", work / f"score-{inp.name}.out.json"
    job.write_text(json.dumps({"input": str(inp.whole), "columns": inp.columns, "sets": sets}))
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", SCORER, str(job), str(result)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"scoring {inp.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="09fb092", help="commit before issue 21's work")
    p.add_argument("--after", default="HEAD")
    p.add_argument("--select-ratio", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="select processes at a time")
    p.add_argument("--only", nargs="*", help="input names to run (default: all)")
    p.add_argument("--methods", nargs="*", help="method labels to run (default: all)")
    p.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--keep", action="store_true", help="keep --work")
    p.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = p.parse_args()

    before_sha, after_sha = git("rev-parse", args.before), git("rev-parse", args.after)
    work = args.work or Path(tempfile.mkdtemp(prefix="datamask-identity-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"before": work / "tree-before", "after": work / "tree-after"}
    for side, sha in (("before", before_sha), ("after", after_sha)):
        if trees[side].exists():
            git("worktree", "remove", "--force", str(trees[side]))
        git("worktree", "add", "--detach", str(trees[side]), sha)
    started = time.perf_counter()
    load = os.getloadavg()
    try:
        shards = cut_into_shards(EXAMPLES_DEMO, work / "demo-shards", N_SHARDS)
        examples_cols = ("chunk_id", "quality_score", "feature_arr")
        inputs = [
            Input("shared demo", SHARED_DEMO, SHARED_DEMO, ("id", "quality_score", "embedding")),
            Input("examples demo", EXAMPLES_DEMO, EXAMPLES_DEMO, examples_cols),
            Input(
                "sharded demo, --partition shard",
                shards,
                EXAMPLES_DEMO,
                examples_cols,
                ("--partition", "shard", "--budget", "global", "--oversample", "2"),
                sharded=True,
            ),
            Input(
                "sharded demo, --partition cluster",
                shards,
                EXAMPLES_DEMO,
                examples_cols,
                (
                    "--partition",
                    "cluster",
                    "--n-clusters",
                    "4",
                    "--budget",
                    "global",
                    "--oversample",
                    "2",
                ),  # fmt: skip
                sharded=True,
            ),
        ]
        if args.only:
            inputs = [i for i in inputs if i.name in args.only]
        methods = [m for m in METHODS if not args.methods or m[0] in args.methods]
        cases = []
        for i, inp in enumerate(inputs):
            for j, (label, method, algorithm) in enumerate(methods):
                for side in ("before", "after"):
                    out = work / "out" / side / f"{i}-{j}"
                    out = out if inp.sharded else out.with_suffix(".parquet")
                    out.parent.mkdir(parents=True, exist_ok=True)
                    cli = select_args(inp, method, algorithm, args)
                    cases.append((inp, label, method, algorithm, side, cli, out))

        shim = work / "old-seeding"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(OLD_SEEDING)

        def one(case):
            inp, label, method, algorithm, side, cli, out = case
            log = out.parent / (out.name.removesuffix(".parquet") + ".log")
            tree = trees["after" if side == "replay" else side]
            rc, secs = run_select(tree, cli, out, log, shim if side == "replay" else None)
            ids = kept_ids(out, inp.columns[0]) if rc == 0 else None
            print(f"{side:6s} {inp.name:35s} {label:18s} rc={rc} {secs:5.1f}s", flush=True)
            return (inp.name, label, side), {"rc": rc, "seconds": secs, "ids": ids, "log": log}

        with ThreadPoolExecutor(args.jobs) as pool:
            runs = dict(pool.map(one, cases))
            # the after tree with the old seeding, where the selections differ
            replays = []
            for inp, label, method, algorithm, side, cli, out in cases:
                b, a = runs[(inp.name, label, "before")], runs[(inp.name, label, "after")]
                if side == "after" and b["ids"] is not None and b["ids"] != a["ids"]:
                    out = Path(str(out).replace("/out/after/", "/out/replay/"))
                    out.parent.mkdir(parents=True, exist_ok=True)
                    replays.append((inp, label, method, algorithm, "replay", cli, out))
            runs.update(pool.map(one, replays))

        rows: dict[str, list[dict]] = {}
        for inp in inputs:
            sets = {}
            for label, method, algorithm in methods:
                b, a = runs[(inp.name, label, "before")], runs[(inp.name, label, "after")]
                row = {"label": label, "method": method, "algorithm": algorithm}
                for side, r in (("before", b), ("after", a)):
                    if r["rc"]:
                        row[f"error_{side}"] = r["log"].read_text()[-600:]
                if b["ids"] is not None and a["ids"] is not None:
                    row["k"] = (len(b["ids"]), len(a["ids"]))
                    row["identical"] = b["ids"] == a["ids"]
                    row["overlap"] = len(set(b["ids"]) & set(a["ids"]))
                    sets[f"{label}|before"] = {"ids": b["ids"], "algorithm": algorithm}
                    if not row["identical"]:
                        sets[f"{label}|after"] = {"ids": a["ids"], "algorithm": algorithm}
                        r = runs[(inp.name, label, "replay")]
                        row["replay"] = None if r["ids"] is None else r["ids"] == b["ids"]
                rows.setdefault(inp.name, []).append(row)
            js = score(trees["after"], inp, sets, work)
            for row in rows[inp.name]:
                if "identical" in row:
                    row["J_before"] = js[f"{row['label']}|before"]
                    row["J_after"] = js.get(f"{row['label']}|after", row["J_before"])
        total = time.perf_counter() - started
        write_results(args, inputs, rows, before_sha, after_sha, total, load, os.getloadavg())
        (work / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
        print(f"wrote {args.results} in {total:.0f} s; work in {work}")
    finally:
        for tree in trees.values():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def reason(row: dict) -> str:
    if row.get("identical"):
        return ""
    if row["method"] in DETERMINISTIC:
        return "**finding**: a method that draws nothing moved"
    if row.get("replay"):
        return (
            "by design: spawned streams (issue 21 point 5, docs/method.md 'Random streams'); "
            "the after tree with the old seeding selects the before set bit for bit"
        )
    return "**not explained by the seeding**: the after tree with the old seeding differs too"


def write_results(args, inputs, rows, before_sha, after_sha, total, load0, load1) -> None:
    lines = [
        "# Issue 21: selections before and after, bit for bit",
        "",
        "`python benchmarks/archive/identity/run.py` (its docstring says how). Before: "
        f"`{before_sha[:7]}` (the last commit before issue 21's work); after: `{after_sha[:7]}`. "
        f"Every run: `python -m datamask.cli select --select-ratio {args.select_ratio} "
        f"--seed {args.seed} --lamb 0.5 --device cpu --threads 1` with the column flags "
        "given, the same on both sides (sharded inputs add their `--partition` flags). "
        "Identical means the same sorted kept id list. J is scored by the after tree's "
        "`evaluate_selection` with the run's objective (quality + the `--algorithm` term, "
        "lamb 0.5) for both sets; overlap is the number of kept ids in common, of k. "
        "Where the sets differ, *old seeding* reruns the after tree with the seeding it had "
        "before issue 21 (every component's generators seeded with the seed itself; "
        "`OLD_SEEDING` in run.py): `identical` there means the seeding is the whole "
        "difference.",
        "",
        f"{total:.0f} s in all, `--jobs {args.jobs}`, on {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), load average "
        f"{load0[0]:.1f} at the start and {load1[0]:.1f} at the end (other work shared the "
        "machine).",
        "",
    ]
    for inp in inputs:
        where = os.path.relpath(inp.path, REPO)
        lines += [f"## {inp.name}", "", f"`{where}`", ""]
        if inp.sharded:
            lines[-2] = (
                f"`examples/demo/demo_docs.parquet` cut into {N_SHARDS} contiguous shards, "
                f"`{' '.join(inp.flags)}`"
            )
        lines += [
            "| method | identical | J before | J after | overlap | old seeding | reason |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        for row in rows[inp.name]:
            if "identical" not in row:
                err = {s: row.get(f"error_{s}") for s in ("before", "after")}
                last = {s: (e or "").strip().splitlines()[-1:] for s, e in err.items() if e}
                lines.append(f"| {row['label']} | error: {last} | | | | | |")
                continue
            k = row["k"][0] if row["k"][0] == row["k"][1] else "{} / {}".format(*row["k"])
            same = "yes" if row["identical"] else "no"
            replay = {None: "", True: "identical", False: "differs"}[row.get("replay")]
            if "replay" in row and row["replay"] is None:
                replay = "error"
            lines.append(
                f"| {row['label']} | {same} | {row['J_before']:.5f} | {row['J_after']:.5f} "
                f"| {row['overlap']} of {k} ({100 * row['overlap'] / row['k'][0]:.0f}%) "
                f"| {replay} | {reason(row)} |"
            )
        lines.append("")
    notes = ""  # the hand-written reading below the marker survives a rerun
    if args.results.exists() and NOTES in args.results.read_text():
        notes = args.results.read_text().split(NOTES, 1)[1]
    args.results.write_text("\n".join(lines) + "\n" + NOTES + notes)


if __name__ == "__main__":
    main()
