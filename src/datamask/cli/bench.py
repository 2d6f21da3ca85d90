"""``datamask bench``: several methods on the same data and objective; table and plots.

datamask bench --synthetic 50000 --select-ratio 0.1 --out-dir out/bench-50k
datamask bench --input docs.parquet --methods mask greedy topk random --out-dir out/b
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import SelectorSpec
from ..evaluate.bench import DEFAULT_METHODS, bench, format_markdown
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from ..options import options, selector_options
from ..selectors import SELECTORS
from ..synthetic import make_clustered
from .args import add_option, add_options
from .common import (
    add_data_arguments,
    add_redundancy_arguments,
    add_scoring_arguments,
    objective_from,
    read_corpus_arg,
)

__all__ = ["add_bench_parser", "run_bench"]


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
        choices=list(SELECTORS),
        default=list(DEFAULT_METHODS),
        help=f"methods to run, in order (default: {' '.join(DEFAULT_METHODS)})",
    )
    shared = {o.name: o for o in options(SelectorSpec)}
    add_option(p, shared["select_ratio"])  # select's option: one default (0.3)
    add_option(p, shared["seed"])
    add_options(
        p.add_argument_group(
            "method parameters", "each is passed to every method run that takes it"
        ),
        selector_options(),
    )
    p.add_argument(
        "--disf-batch-size",
        "--disf_batch_size",
        dest="disf_batch_size",
        type=int,
        default=None,
        help="disf-greedy batch size alone (--batch-size sets every method's)",
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
    add_scoring_arguments(p)
    add_data_arguments(p)
    add_redundancy_arguments(p)
    return p


def _method_params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per method run, the method parameters the flags give: each flag goes to every method
    that takes it; ``--param METHOD.KEY=VALUE`` to one method, typed by the key's option."""
    params: dict[str, dict[str, Any]] = {}
    for opt in selector_options():
        value = getattr(args, opt.name, None)
        for method in opt.owners:
            if value is not None and method in args.methods:
                params.setdefault(method, {})[opt.name] = value
    if args.disf_batch_size is not None:
        params.setdefault("disf-greedy", {})["batch_size"] = args.disf_batch_size
    shared = {o.name: o for o in options(SelectorSpec)}
    for item in args.param:
        key, sep, text = item.partition("=")
        method, dot, name = key.rpartition(".")
        name = name.replace("-", "_")
        if not sep or not dot or not name:
            raise ValueError(
                f"--param takes METHOD.KEY=VALUE (e.g. mask.partial=0.2); got {item!r}."
            )
        if method not in SELECTORS:
            raise ValueError(f"--param method must be one of {list(SELECTORS)}; got {method!r}.")
        own = {o.name: o for o in selector_options() if method in o.owners}
        opt = own.get(name) or shared.get(name)
        if opt is None:
            raise ValueError(
                f"--param {item!r}: {name} is not a parameter of method {method!r} (it takes "
                f"{sorted(own) + ['max_similarity']})."
            )
        params.setdefault(method, {})[name] = opt.check(_typed(text, opt.kind))
    return {m: p for m, p in params.items() if m in args.methods}


def _typed(text: str, kind: type) -> Any:
    """``text`` as ``kind`` (``none`` -> None), as a flag would parse it."""
    if text.lower() in ("none", "null"):
        return None
    if kind is bool:
        return text.lower() in ("1", "true", "yes")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--param value {text!r} is not {kind.__name__}.") from None


def run_bench(args: argparse.Namespace) -> int:
    """``datamask bench``: run the methods, write bench.md/bench.json/PNGs, print the table."""
    objective = objective_from(args)  # checked before any work
    check_writable(args.out_dir, folder=True)  # before any method runs
    if args.input:
        check_no_overlap([args.out_dir], [args.input], what="--out-dir")
    if args.synthetic is not None:
        if args.synthetic < 2:
            raise ValueError(f"--synthetic must be >= 2 documents; got {args.synthetic}.")
        if args.dim < 1 or args.clusters < 1:
            raise ValueError(f"--dim and --clusters must be >= 1; got {args.dim}, {args.clusters}.")
        corpus = make_clustered(args.synthetic, args.dim, args.clusters, seed=args.data_seed)
        corpus.source = (
            f"make_clustered({args.synthetic}, {args.dim}, {args.clusters}, seed={args.data_seed})"
        )
    else:
        corpus, _ = read_corpus_arg(args, args.input)
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
            objective=objective,
            select_ratio=args.select_ratio,  # None: select's default
            seed=args.seed,  # None: select's default, as select_ratio and device
            device=args.device,
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
    print(format_markdown(result))
    print(f"wrote {', '.join(result['files'].values())}")
    return 0
