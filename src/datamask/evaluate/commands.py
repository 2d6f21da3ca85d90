"""``datamask evaluate`` and ``datamask bench``: argument parsers and runners.

    datamask evaluate --input docs.parquet --selection out/selection.parquet
    datamask bench --synthetic 50000 --select-ratio 0.1 --out-dir out/bench-50k
    datamask bench --input docs.parquet --methods mask greedy topk random --out-dir out/b

``datamask.cli`` registers the parsers; bad input raises ValueError (one line, exit 2).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

__all__ = ["add_bench_parser", "add_evaluate_parser", "run_bench", "run_evaluate"]

from ..cli import add_column_arguments, add_graph_arguments, add_threads_argument

_ALGORITHMS = ["Facility", "Pair_simi", "DiSF"]
_METHODS = ["mask", "greedy", "greedy-dense", "stochastic-greedy", "disf-greedy", "topk", "random"]


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    add_column_arguments(p, with_defaults=False)  # None: from --preset or the input's columns
    add = p.add_argument
    from ..presets import PRESETS

    add(
        "--preset",
        choices=["auto", *PRESETS],
        help="column names of a known layout (as for select; default: auto, detected)",
    )
    add("--split", help="split of a DatasetDict save_to_disk folder (default: the only one)")
    add(
        "--length-col",
        "--length_col",
        dest="length_col",
        default=None,
        help="column for the length distribution, numbers or texts (default: the first of "
        "n_chars, length, n_tokens, text present; none -> no length section)",
    )


def _add_redundancy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dup-thresholds",
        "--dup_thresholds",
        dest="dup_thresholds",
        nargs="+",
        type=float,
        default=[0.9, 0.95, 0.99],
        help="cosine thresholds of the near-duplicate figures (pairs, documents and largest "
        "group above each) (default: 0.9 0.95 0.99)",
    )
    p.add_argument(
        "--dup-search",
        "--dup_search",
        dest="dup_search",
        choices=["auto", "exact", "ivf"],
        default="auto",
        help="pair search over the whole input: exact, or ivf (k-means cells, approximate: "
        "lower bounds) (default: auto = exact up to 100,000 documents or on CUDA)",
    )


def _add_objective_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--algorithm",
        nargs="+",
        choices=_ALGORITHMS,
        default=["Facility"],
        help="diversity metric(s) of the objective, equally weighted (default: Facility)",
    )
    p.add_argument(
        "--lamb",
        type=float,
        default=0.5,
        help="weight of quality in the objective, in [0, 1] (default: 0.5)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    add_threads_argument(p)


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask evaluate``."""
    p = subparsers.add_parser(
        "evaluate",
        help="score a selection: the objective, every term and diagnostics",
        description="Score a selection of --input: the objective J and each term, quality "
        "mean, facility-location coverage of the whole set, mean pairwise similarity, DiSF "
        "correlation loss, mean nearest-neighbour similarity inside the subset and the "
        "length distribution. Prints a table and writes JSON.",
    )
    p.add_argument("--input", required=True, help="the parquet the selection was made from")
    p.add_argument(
        "--selection",
        required=True,
        help="`datamask select` output (parquet with the id column and a boolean "
        "`selected` column), a parquet of selected ids only, or a text file with "
        "one id per line",
    )
    p.add_argument(
        "--output", default=None, help="JSON report path (default: <selection>.eval.json beside it)"
    )
    p.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="what is printed on stdout (default: table)",
    )
    _add_objective_arguments(p)
    _add_data_arguments(p)
    _add_redundancy_arguments(p)
    return p


def add_bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask bench``."""
    p = subparsers.add_parser(
        "bench",
        help="run several selectors on the same data and objective; table + plots",
        description="Run several methods on the same data with the same objective and write "
        "bench.md, bench.json and PNG plots (objective, each term, wall time, peak memory).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="parquet file to select from")
    src.add_argument(
        "--synthetic",
        type=int,
        metavar="N",
        help="generate N clustered documents (datamask.make_clustered) instead",
    )
    p.add_argument("--dim", type=int, default=384, help="--synthetic width (default: 384)")
    p.add_argument(
        "--clusters", type=int, default=50, help="--synthetic cluster count (default: 50)"
    )
    p.add_argument(
        "--data-seed",
        "--data_seed",
        dest="data_seed",
        type=int,
        default=0,
        help="--synthetic generator seed (default: 0)",
    )
    p.add_argument(
        "--out-dir",
        "--out_dir",
        dest="out_dir",
        required=True,
        help="directory for bench.md, bench.json and the PNGs",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=_METHODS,
        default=["mask", "greedy", "stochastic-greedy", "topk", "random"],
        help="methods to run, in order (default: mask greedy stochastic-greedy topk random)",
    )
    p.add_argument(
        "--select-ratio",
        "--select_ratio",
        dest="select_ratio",
        type=float,
        default=0.1,
        help="fraction of documents kept, in (0, 1) (default: 0.1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every method (default: 0)")
    p.add_argument(
        "--n-epochs",
        "--n_epochs",
        dest="n_epochs",
        type=int,
        default=None,
        help="learner steps (default: the learner's own, 100 for the expected estimator)",
    )
    add_graph_arguments(p, with_defaults=True)
    p.add_argument(
        "--eps",
        type=float,
        default=None,
        help="stochastic-greedy eps; sample (n/k) log(1/eps) (default: 0.1)",
    )
    p.add_argument(
        "--disf-batch-size",
        "--disf_batch_size",
        dest="disf_batch_size",
        type=int,
        default=None,
        help="disf-greedy batch size (default: 1024)",
    )
    p.add_argument(
        "--disf-reference-batches",
        dest="disf_reference_batches",
        type=int,
        default=0,
        help="also time the original per-candidate DiSF loop on this "
        "many batches and extrapolate to all (default: 0 = skip)",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="extra selector argument, e.g. mask.partial=0.2 or greedy.batch_size=4; repeatable",
    )
    p.add_argument(
        "--map",
        dest="map_method",
        choices=["pca", "tsne"],
        default="pca",
        help="projection of the 2-D map (default: pca)",
    )
    p.add_argument(
        "--map-points",
        dest="map_points",
        type=int,
        default=3000,
        help="documents drawn on the map (default: 3000)",
    )
    p.add_argument(
        "--no-plots",
        dest="plots",
        action="store_false",
        help="skip the PNGs (no matplotlib needed)",
    )
    p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="run every method in this process (faster start; memory numbers "
        "then include allocator reuse between methods)",
    )
    p.add_argument("--title", default=None, help="markdown heading")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no line per finished method"
    )
    _add_objective_arguments(p)
    _add_data_arguments(p)
    _add_redundancy_arguments(p)
    return p


# --- runners ---------------------------------------------------------------------------------
def _read(args: argparse.Namespace, path: str) -> Any:
    from ..io.datasets import input_column_names, is_save_to_disk, read_input_corpus
    from ..presets import resolve_columns
    from .report import LENGTH_COLUMNS

    split = getattr(args, "split", None)
    names = input_column_names(path, split=split) if Path(path).exists() else []
    given = [n for n, _ in args.quality_col] if args.quality_col else None
    id_col, quality_cols, feature_col = resolve_columns(
        names,
        preset=getattr(args, "preset", None),
        id_col=args.id_col,
        quality_cols=given,
        feature_col=args.feature_col,
        where=str(path),
    )
    args.id_col, args.feature_col = id_col or "chunk_id", feature_col  # read_selection's too
    specs = args.quality_col or [(n, 1.0) for n in quality_cols]
    extra: list[str] = []
    wanted = [args.length_col] if args.length_col else list(LENGTH_COLUMNS)
    if Path(path).is_file() or is_save_to_disk(path):
        present = [c for c in wanted if c in names]
        if args.length_col and not present and names:
            raise ValueError(
                f"column {args.length_col!r} not found in {path}; available columns: {names}."
            )
        extra = present[:1]  # read one length source only (texts can be large)
    return read_input_corpus(
        path,
        split=split,
        id_col=args.id_col,
        quality_cols=[n for n, _ in specs],
        quality_weights=[w for _, w in specs],
        feature_col=args.feature_col,
        extra_cols=extra,
    )


def _check_lamb(lamb: float) -> None:
    from .._validation import check_ratio

    check_ratio("lamb", lamb, low_open=False, high_open=False)


def run_evaluate(args: argparse.Namespace) -> int:
    """``datamask evaluate``: print the table (or JSON) and write the JSON report."""
    import json

    from .._device import set_threads
    from ..io.atomic import OutputLock, atomic_write_json, check_no_overlap, check_writable
    from .report import format_report

    set_threads(args.threads)
    _check_lamb(args.lamb)
    sel = Path(args.selection)
    output = (
        Path(args.output)
        if args.output
        else sel.with_name(sel.name.removesuffix(sel.suffix) + ".eval.json")
    )
    # Before any computation: the report never overwrites the data or the selection.
    check_writable(output)
    check_no_overlap([output], [args.input, args.selection])
    with OutputLock(output):
        report = _evaluate(args)
        atomic_write_json(report, output)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        print(f"wrote {output}")
    return 0


def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from .report import evaluate_selection, read_selection

    corpus = _read(args, args.input)
    rows = read_selection(args.selection, corpus.ids, id_col=args.id_col)
    report = evaluate_selection(
        corpus,
        rows,
        algorithm=args.algorithm,
        lamb=args.lamb,
        length_col=args.length_col,
        device=args.device,
        dup_thresholds=args.dup_thresholds,
        dup_search=args.dup_search,
    )
    report["selection"] = str(args.selection)
    return report


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: keep it as a string


def _method_params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    params: dict[str, dict[str, Any]] = {}
    if args.n_epochs is not None:
        params.setdefault("mask", {})["n_epochs"] = args.n_epochs
    if args.eps is not None:
        params.setdefault("stochastic-greedy", {})["eps"] = args.eps
    if args.disf_batch_size is not None:
        params.setdefault("disf-greedy", {})["batch_size"] = args.disf_batch_size
    for item in args.param:
        key, sep, value = item.partition("=")
        method, dot, name = key.rpartition(".")
        if not sep or not dot or not name:
            raise ValueError(
                f"--param takes METHOD.KEY=VALUE (e.g. mask.partial=0.2); got {item!r}."
            )
        if method not in _METHODS:
            raise ValueError(f"--param method must be one of {_METHODS}; got {method!r}.")
        params.setdefault(method, {})[name.replace("-", "_")] = _literal(value)
    return {m: p for m, p in params.items() if m in args.methods}


def run_bench(args: argparse.Namespace) -> int:
    """``datamask bench``: run the methods, write bench.md/bench.json/PNGs, print the table."""
    from ..io.atomic import OutputLock, check_no_overlap, check_writable
    from .bench import bench

    _check_lamb(args.lamb)
    check_writable(args.out_dir, folder=True)  # before any method runs
    if args.input:
        check_no_overlap([args.out_dir], [args.input], what="--out-dir")
    if args.synthetic is not None:
        from ..synthetic import make_clustered

        if args.synthetic < 2:
            raise ValueError(f"--synthetic must be >= 2 documents; got {args.synthetic}.")
        if args.dim < 1 or args.clusters < 1:
            raise ValueError(f"--dim and --clusters must be >= 1; got {args.dim}, {args.clusters}.")
        corpus = make_clustered(args.synthetic, args.dim, args.clusters, seed=args.data_seed)
        corpus.source = (
            f"make_clustered({args.synthetic}, {args.dim}, {args.clusters}, seed={args.data_seed})"
        )
    else:
        corpus = _read(args, args.input)
    if len(set(args.methods)) != len(args.methods):
        raise ValueError(f"--methods lists a method twice: {args.methods}.")
    if args.map_points < 1:
        raise ValueError(f"--map-points must be >= 1; got {args.map_points}.")
    if args.disf_reference_batches < 0:
        raise ValueError(
            f"--disf-reference-batches must be >= 0; got {args.disf_reference_batches}."
        )
    with OutputLock(args.out_dir, folder=True):  # no second bench into the same folder
        result = bench(
            corpus,
            methods=args.methods,
            algorithm=args.algorithm,
            lamb=args.lamb,
            select_ratio=args.select_ratio,
            seed=args.seed,
            device=args.device,
            n_neighbors=args.n_neighbors,
            knn=args.knn,
            n_probe=args.n_probe,
            threads=args.threads,
            method_params=_method_params(args),
            disf_reference_batches=args.disf_reference_batches,
            isolate=args.isolate,
            out_dir=args.out_dir,
            plots=args.plots,
            map_method=args.map_method,
            map_points=args.map_points,
            title=args.title,
            progress=args.progress,
            dup_thresholds=args.dup_thresholds,
            dup_search=args.dup_search,
        )
    from .bench import format_markdown

    print(format_markdown(result))
    print(f"wrote {', '.join(result['files'].values())}")
    return 0
