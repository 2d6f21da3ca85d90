"""The sharded side of ``datamask select``: its flags and the command body.

    datamask select --input 'data/*.parquet' --output out/sel --select-ratio 0.1
    datamask select --input data/ --output out/sel --partition cluster --n-clusters 64
    datamask select --input data/ --output out/sel --method greedy --workers 2
    datamask select --input data/ --output out/sel --ray-address auto --workers 8

``--output`` is a folder: ``selected/part-*.parquet`` (a parquet dataset of the kept ids)
and ``manifest.json``. Rerunning the same command resumes a killed run.
"""

from __future__ import annotations

import argparse
from typing import Any

from .partition import PARTITIONS
from .runner import BUDGETS, LocalRunner, Settings, available_cpus, run_selection

__all__ = ["add_distributed_arguments", "run_distributed", "make_runner"]

RUNNERS = ("local", "ray")


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sharded-selection flags to a ``select`` parser (defaults resolved later)."""
    g = parser.add_argument_group(
        "sharded selection",
        "used when --input is a directory or glob of parquet shards, or --partition is given",
    )
    add = g.add_argument
    add(
        "--partition",
        choices=PARTITIONS,
        help="selection groups: one per shard, fixed-size chunks of rows, or k-means "
        "clusters of the embeddings (default: shard)",
    )
    add(
        "--chunk-size",
        "--chunk_size",
        dest="chunk_size",
        type=int,
        help="rows per group for --partition chunk, and the largest cluster group before "
        "it is split for --partition cluster (default: 100000)",
    )
    add(
        "--n-clusters",
        "--n_clusters",
        dest="n_clusters",
        type=int,
        help="k-means clusters for --partition cluster (default: ceil(N / chunk-size))",
    )
    add(
        "--kmeans-sample",
        "--kmeans_sample",
        dest="kmeans_sample",
        type=int,
        help="rows sampled to fit the k-means centroids (default: 100000)",
    )
    add(
        "--budget",
        choices=BUDGETS,
        help="global: each group proposes candidates and one global round over their union "
        "keeps exactly round(select-ratio * N); group: each group keeps its proportional "
        "share (default: global)",
    )
    add(
        "--oversample",
        type=float,
        help="--budget global: candidates per group as a multiple of its proportional share "
        "(default: 2.0; exact merges for topk and random need none)",
    )
    add(
        "--workers",
        type=int,
        help="groups selected at once (default: the cores available here; with Ray, every "
        "GPU of the cluster, else every CPU)",
    )
    add(
        "--ray-address",
        "--ray_address",
        dest="ray_address",
        help="address of a running Ray cluster, e.g. auto or ray://head:10001 "
        "(default: start a local Ray)",
    )
    add(
        "--work-dir",
        "--work_dir",
        dest="work_dir",
        help="per-group results and completion markers, for resuming (default: OUTPUT/_work)",
    )
    add(
        "--runner",
        choices=RUNNERS,
        help="local: a process pool of --workers on this machine; ray: Ray tasks, for a "
        "cluster (default: local, ray when --ray-address is given)",
    )


def make_runner(
    runner: str | None, workers: int | None, address: str | None, device: str = "auto"
) -> Any:
    """The runner the flags ask for (see ``--runner``); nothing is started yet."""
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ValueError(f"--workers must be a positive integer; got {workers}.")
    runner = runner or ("ray" if address else "local")
    if runner == "local":
        if address:
            raise ValueError("--ray-address needs --runner ray; got --runner local.")
        return LocalRunner(workers=workers or available_cpus())
    from .ray_backend import RayRunner

    return RayRunner(workers=workers, address=address, device=device)


def _print_summary(m: dict[str, Any]) -> None:
    t, s = m["totals"], m["summary"]
    gs = s["group_seconds"]
    print(
        f"selected {t['k']} of {t['n_docs']} documents in {t['n_groups']} groups "
        f"(partition={m['partition']['by']}, {t['groups_computed']} computed, "
        f"{t['groups_reused']} reused) in {t['seconds']['total']:.1f}s: "
        f"{t['docs_per_second']:,.0f} docs/s overall"
    )
    line = (
        f"per group: median {gs['median']:.2f}s (min {gs['min']:.2f}, max {gs['max']:.2f}); "
        f"peak RSS per worker {s['peak_rss_mb_per_worker']:.0f} MB"
    )
    if s["gpu_peak_mb_per_worker"] is not None:
        line += f"; peak GPU memory {s['gpu_peak_mb_per_worker']:.0f} MB"
    print(line + f"; runner {m['runner']['runner']} x{m['runner'].get('workers', 1)}")
    b = m["budget"]
    if b["global_round"]:
        g = b["global_round"]
        print(
            f"global budget: {b['candidates']} candidates (oversample {b['oversample']:g}), "
            f"global round {g['seconds']['total']:.1f}s, peak RSS {g['peak_rss_mb']:.0f} MB"
        )
    print(f"wrote {m['output']['selected']}/ ({m['output']['parts']} parts) and manifest.json")


def run_distributed(args: argparse.Namespace) -> int:
    """``datamask select`` over shards. Returns the exit status (0).

    ``args`` carries the usual select settings (``input``, ``output``, ``id_col``,
    ``quality_cols``, ``feature_col``, learner settings, ``seed``, ``device``,
    ``progress``) and the flags of :func:`add_distributed_arguments`.
    """
    settings = Settings.from_namespace(args).check()
    runner = make_runner(
        getattr(args, "runner", None),
        getattr(args, "workers", None),
        getattr(args, "ray_address", None),
        settings.device,
    )
    try:
        manifest = run_selection(
            args.input,
            args.output,
            settings,
            runner=runner,
            work_dir=getattr(args, "work_dir", None),
            progress=bool(getattr(args, "progress", True)),
        )
    finally:
        runner.close()
    _print_summary(manifest)
    return 0
