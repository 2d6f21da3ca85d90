"""Incremental selection (``select --given``) against re-selecting everything, on real text.

    # one split at a time (each a few minutes; timed runs under an exclusive lock)
    flock -x /work/cpu.lock python benchmarks/incremental/run.py \
        --corpus ../shared/data/realtext.parquet --split random --work /tmp/datamask-incremental
    flock -x /work/cpu.lock python benchmarks/incremental/run.py \
        --corpus ../shared/data/realtext.parquet --split topic --work /tmp/datamask-incremental
    python benchmarks/incremental/run.py --markdown-only   # rebuild RESULTS.md

The protocol of issue 31. The corpus is split 80/20 (``old``/``new``):

- ``random``: a seeded random permutation;
- ``topic``: spherical k-means (50 topics, seed 0) of the embeddings; topics drawn in a
  seeded order send 90% of their rows to ``new`` (10% stay in ``old``, so they are rare
  there, not absent) until ``new`` holds 20% of the corpus.

Then, each a ``datamask select`` with the library's defaults (the learner, facility
location, lamb 0.5, seed 0) and ``--threads 2``, each in its own process (its peak RSS is
its own):

- ``old``: 10% of ``old`` (the corpus already kept);
- ``incremental``: 10% of ``new`` ``--given old --given-selection old's selection``;
- ``alone``: 10% of ``new`` without ``--given``;
- ``full``: one selection of the whole corpus at the same total k (``--k``);
- ``sharded``: ``incremental`` with the 20% written as 4 shards, ``--workers 2``, the
  default partition (one k-means group: the 20% fits one ``--chunk-size``);
- ``sharded_groups``: the same with ``--chunk-size 3000`` (5 cluster groups, the budget
  allocated by gains with the exchange round).

J is the exact objective over all documents of the corpus (``exact_j`` of
``benchmarks/scale/sharded_j.py``: corpus-scaled quality, coverage by all pairs) for
``old ∪ incremental``, ``old ∪ alone`` and ``full``. Wall and CPU seconds and peak RSS are
the selecting process's own (reading, floors, selection, writing; not Python's start).
Rows append to ``results/runs.jsonl``; RESULTS.md is rebuilt from them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scale"))
from sharded_j import exact_j  # noqa: E402  (the one exact scorer of the benchmarks)

RESULTS = HERE / "results" / "runs.jsonl"
MARKDOWN = HERE / "RESULTS.md"
ID, Q, F = "chunk_id", "quality_score", "feature_arr"
RATIO = 0.1
TOPICS = 50
SHARDS = 4


def split_rows(table, how: str, seed: int = 0) -> np.ndarray:
    """Bool mask of the ``new`` rows (20%)."""
    n = table.num_rows
    target = round(0.2 * n)
    rng = np.random.default_rng(seed)
    new = np.zeros(n, dtype=bool)
    if how == "random":
        new[rng.permutation(n)[:target]] = True
        return new
    from datamask.neighbors import assign_clusters, spherical_kmeans

    flat = table.column(F).combine_chunks().flatten().to_numpy()
    x = torch.nn.functional.normalize(torch.from_numpy(flat.reshape(n, -1).copy()), dim=1)
    gen = torch.Generator().manual_seed(seed)
    topic = assign_clusters(x, spherical_kmeans(x, TOPICS, generator=gen)).numpy()
    for t in rng.permutation(TOPICS):
        rows = rng.permutation(np.flatnonzero(topic == t))
        take = rows[: int(round(0.9 * len(rows)))][: target - int(new.sum())]
        new[take] = True
        if new.sum() >= target:
            break
    return new


def prepare(corpus: Path, work: Path, how: str) -> dict:
    """``old.parquet``, ``new.parquet`` and ``all.parquet`` (the corpus' three columns)."""
    out = work / how
    out.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(corpus, columns=[ID, Q, F])
    new = split_rows(table, how)
    pq.write_table(table, out / "all.parquet")
    pq.write_table(table.filter(~new), out / "old.parquet")
    pq.write_table(table.filter(new), out / "new.parquet")
    shards = out / "new_shards"
    shards.mkdir(exist_ok=True)
    rows = np.flatnonzero(new)
    for i, part in enumerate(np.array_split(rows, SHARDS)):
        pq.write_table(table.take(part), shards / f"{i:05d}.parquet")
    return {"n_all": table.num_rows, "n_old": int((~new).sum()), "n_new": int(new.sum())}


def one(argv: list[str]) -> None:
    """Child mode: one ``datamask select`` in this process; prints its own measurements."""
    from datamask.cli import main
    from datamask.measure import cpu_seconds, peak_rss_mb

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    code = main(["select", *argv, "--threads", "2", "--no-progress"])
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    print(json.dumps({"rc": code, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak_rss_mb()}))


def run(argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--one", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def kept(path: Path) -> list:
    t = pq.read_table(path, columns=[ID, "selected"])
    return t.filter(t.column("selected")).column(ID).to_pylist()


def bench(corpus: Path, work: Path, how: str, lock: str) -> None:
    sizes = prepare(corpus, work, how)
    d = work / how
    k_old, k_new = round(RATIO * sizes["n_old"]), round(RATIO * sizes["n_new"])
    load = os.getloadavg()[0]
    runs = {
        "old": ["--input", d / "old.parquet", "--output", d / "old_sel.parquet", "--k", k_old],
        "incremental": [
            *("--input", d / "new.parquet", "--output", d / "inc_sel.parquet", "--k", k_new),
            *("--given", d / "old.parquet", "--given-selection", d / "old_sel.parquet"),
        ],
        "alone": ["--input", d / "new.parquet", "--output", d / "alone_sel.parquet", "--k", k_new],
        "full": [
            *("--input", d / "all.parquet", "--output", d / "full_sel.parquet"),
            *("--k", k_old + k_new),
        ],
    }
    for name, extra in (("sharded", []), ("sharded_groups", ["--chunk-size", 3000])):
        shutil.rmtree(d / name, ignore_errors=True)  # a fresh run, never a resumed one
        runs[name] = [
            *("--input", d / "new_shards", "--output", d / name, "--k", k_new, "--workers", 2),
            *("--given", d / "old.parquet", "--given-selection", d / "old_sel.parquet"),
            *extra,
        ]
    measured = {name: run([str(a) for a in argv]) for name, argv in runs.items()}
    old = kept(d / "old_sel.parquet")
    sets = {
        "incremental": old + kept(d / "inc_sel.parquet"),
        "alone": old + kept(d / "alone_sel.parquet"),
        "full": kept(d / "full_sel.parquet"),
    }
    for name in ("sharded", "sharded_groups"):
        sets[name] = old + pq.read_table(d / name / "selected", columns=[ID]).column(0).to_pylist()
    summary = json.loads((d / "inc_sel.summary.json").read_text())
    manifests = {
        n: json.loads((d / n / "manifest.json").read_text()) for n in ("sharded", "sharded_groups")
    }
    row = {
        "split": how,
        "lock": lock,
        **sizes,
        "k_old": k_old,
        "k_new": k_new,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "runs": measured,
        "J": {name: exact_j(d / "all.parquet", set(ids)) for name, ids in sets.items()},
        "incremental_summary": {
            "terms": summary["terms"],
            "terms_union": summary["terms_union"],
            "floor": summary["given"]["floor"],
            "lamb_optimised": summary["given"]["lamb_optimised"],
            "seconds": summary["seconds"],
        },
        "sharded_manifests": {
            n: {
                "n_groups": m["totals"]["n_groups"],
                "allocation": m["budget"]["allocation"],
                "seconds": m["totals"]["seconds"],
                "given": {key: m["given"][key] for key in ("floor", "kept_rows", "rate_totals")},
                "peak_rss_mb_per_worker": m["summary"]["peak_rss_mb_per_worker"],
                "driver_peak_rss_mb": m["totals"]["driver_peak_rss_mb"],
            }
            for n, m in manifests.items()
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def markdown() -> None:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    latest: dict[str, dict] = {}  # the last run of each split, under the exclusive lock first
    for r in rows:
        held = latest.get(r["split"])
        if (
            held is None
            or r.get("lock", "exclusive") == "exclusive"
            or held.get("lock") != "exclusive"
        ):
            latest[r["split"]] = r
    out = [
        "# Incremental selection (`select --given`) on real text",
        "",
        "Generated by `benchmarks/incremental/run.py` from `results/runs.jsonl` (the last run",
        "of each split); do not edit by hand. The 56,459-document real-text corpus (MiniLM,",
        "384-d), split 80/20; `old` = 10% of the 80%, `incremental` = 10% of the 20% `--given`",
        "old's selection, `alone` = 10% of the 20% without `--given`, `full` = one selection",
        "of the whole corpus at the same total k. Every run: `datamask select` defaults (the",
        "learner, facility location, lamb 0.5, seed 0), `--threads 2`, its own process, the",
        "machine held as the `lock` column below says (exclusive: nothing else ran; the load",
        "average before and after is recorded with it). J: exact,",
        "over every document of the corpus (`exact_j` of `benchmarks/scale/sharded_j.py`).",
        "",
        "| split | selection | J over all 56k | vs full | quality | coverage | wall s | CPU s "
        "| peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    checks = []
    for how in ("random", "topic"):
        if how not in latest:
            continue
        r = latest[how]
        full = r["J"]["full"]["J"]
        for name, label in (
            ("incremental", "old + incremental (`--given`)"),
            ("alone", "old + the 20% alone"),
            ("full", "full (one selection)"),
            ("sharded", "old + incremental, 4 shards, 2 workers (1 group)"),
            ("sharded_groups", "old + incremental, 4 shards, 2 workers, 5 groups"),
        ):
            if name not in r["J"]:  # rows from before the sharded runs
                continue
            j = r["J"][name]
            m = r["runs"][name]
            run_cols = f"{m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['peak_rss_mb']:.0f}"
            if name != "full":
                o = r["runs"]["old"]
                run_cols = (
                    f"{m['wall_s']:.1f} (+{o['wall_s']:.1f} old) | {m['cpu_s']:.1f} | "
                    f"{m['peak_rss_mb']:.0f}"
                )
            out.append(
                f"| {how} | {label} | {j['J']:.5f} | {100 * j['J'] / full:.2f}% | "
                f"{j['quality']:.4f} | {j['coverage']:.4f} | {run_cols} |"
            )
        inc, alone = r["J"]["incremental"]["J"], r["J"]["alone"]["J"]
        t_inc, t_full = r["runs"]["incremental"]["wall_s"], r["runs"]["full"]["wall_s"]
        checks += [
            (how, "incremental J >= 99.5% of full's", f"{inc / full:.2%}", inc >= 0.995 * full),
            (how, "incremental J >= alone's", f"{inc:.5f} vs {alone:.5f}", inc >= alone),
            (
                how,
                "incremental wall <= 30% of full's",
                f"{100 * t_inc / t_full:.0f}%",
                t_inc <= 0.3 * t_full,
            ),
        ]
        if "sharded_groups" in r["J"]:
            for name in ("sharded", "sharded_groups"):
                j = r["J"][name]["J"]
                checks.append(
                    (how, f"{name} J >= 99.5% of full's", f"{j / full:.2%}", j >= 0.995 * full)
                )
    out += ["", "## Targets (issue 31)", ""]
    out += ["| split | target | measured | met |", "|---|---|---|---|"]
    out += [f"| {h} | {t} | {v} | {'yes' if ok else '**no**'} |" for h, t, v, ok in checks]
    out += ["", "## The incremental runs' own summaries", ""]
    out += [
        "| split | n old / new | k old / new | floor (method, mean, s) | lamb optimised | "
        "J given KEPT | J of old ∪ new, old's selection ∪ S (summary) | lock | load before / "
        "after |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for how in ("random", "topic"):
        if how not in latest:
            continue
        r = latest[how]
        s = r["incremental_summary"]
        f = s["floor"]
        out.append(
            f"| {how} | {r['n_old']:,} / {r['n_new']:,} | {r['k_old']:,} / {r['k_new']:,} | "
            f"{f['method']}, {f['mean']:.4f}, {f['seconds']:.2f} | {s['lamb_optimised']:.4f} | "
            f"{s['terms']['J']:.5f} | {s['terms_union']['J']:.5f} | "
            f"{r.get('lock', 'exclusive')} | {r['load_before']:.2f} / {r['load_after']:.2f} |"
        )
    out += [
        "",
        "The summary's union J is scored over every document of `old` and `new` (the corpus)",
        "with old's selection and S kept, as `evaluate` of the two files together would: it",
        "should equal the incremental row's exact J above.",
        "",
        "Sharded incremental: the 20% as 4 parquet shards, `--workers 2` (the local process",
        "pool), `--given` old with old's selection. Its CPU seconds and peak RSS above are",
        "the driver process's only; the pool's workers' peak is the manifest's",
        "`peak_rss_mb_per_worker` (below). **Caveat on every peak RSS column above:** on",
        "Linux a child process's `ru_maxrss` starts at its parent's RSS at fork (checked: a",
        "child of a 300 MB process reports 313 MB), so a run smaller than this script's own",
        "process (which holds the corpus table, and in the topic split the k-means) reports",
        "the script's size: the `alone` and sharded driver rows (793 MB random, 944 MB",
        "topic) are that floor, not their own peak.",
        "",
        "| split | run | groups | allocation | floor mean | kept rows s | select s | total s "
        "| worker peak RSS MB |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for how in ("random", "topic"):
        r = latest.get(how)
        for name, m in (r or {}).get("sharded_manifests", {}).items():
            g = m["given"]
            out.append(
                f"| {how} | {name} | {m['n_groups']} | {m['allocation']} | "
                f"{g['floor']['mean']:.4f} | {g['kept_rows']['seconds']:.2f} | "
                f"{m['seconds']['select']:.1f} | {m['seconds']['total']:.1f} | "
                f"{m['peak_rss_mb_per_worker']:.0f} |"
            )
    out.append("")
    from given_learner import section  # issue 45 part 5: the learner against the greedy

    out += section()
    MARKDOWN.write_text("\n".join(out))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, default=HERE.parents[2] / "shared/data/realtext.parquet")
    p.add_argument("--split", choices=["random", "topic"])
    p.add_argument("--work", type=Path, default=Path("/tmp/datamask-incremental"))
    p.add_argument("--markdown-only", action="store_true")
    p.add_argument(
        "--lock",
        choices=["exclusive", "shared"],
        default="exclusive",
        help="how the command was run: under `flock -x` (nothing else running) or `flock -s`; "
        "recorded with the row, and RESULTS.md prefers exclusive rows",
    )
    args = p.parse_args()
    if not args.markdown_only:
        if args.split is None:
            p.error("--split is required (random or topic)")
        bench(args.corpus, args.work, args.split, args.lock)
    markdown()


if __name__ == "__main__":
    main()
