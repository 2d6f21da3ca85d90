"""``datamask bench``: several methods on the same data and objective; table and plots.

datamask bench --synthetic 50000 --select-ratio 0.1 --out-dir out/bench-50k
datamask bench --input docs.parquet --methods mask greedy topk random --out-dir out/b

The flags are made from the declarations of :class:`~datamask.evaluation.bench.BenchSpec`
(and :class:`~datamask.evaluation.bench_spec.SyntheticSpec`); the flags given become one
spec, checked once by :meth:`BenchSpec.from_mapping`, before any output or work.
"""

from __future__ import annotations

import argparse

from ..config import selector_settings
from ..doors import bench
from ..evaluation.bench import BenchSpec, format_markdown
from ..evaluation.bench_spec import SyntheticSpec
from ..settings import COLUMN_KEYS, section_settings, warn_ignored_settings
from .args import add_flag, add_flags, add_objective_arguments
from .common import add_config_argument, add_data_arguments, places_from_args, spec_from_args

__all__ = ["add_bench_parser", "run_bench"]

#: Flags spelled otherwise than ``--`` + the key.
_FLAGS = {"map_method": ["--map", "--map-method"], "out_dir": ["--output", "--out-dir"]}
#: Settings whose flags come from elsewhere: the shared column group.
_ELSEWHERE = ("split", "length_col")


def add_bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``datamask bench``."""
    p = subparsers.add_parser(
        "bench",
        help="run several selectors on the same data and objective; table + plots",
        description="Run several methods on the same data with the same objective and write "
        "bench.md, bench.json and PNG plots (objective, each term, wall time, peak memory). "
        "With --budget-tokens or --select-token-ratio every method keeps the same budget of "
        "tokens (the length column's, --length-col) and each row shows its kept documents "
        'and kept tokens (docs/method.md "Token budgets": each method\'s per-token rule).',
    )
    add_config_argument(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", help="parquet file to select from")
    synthetic = section_settings(SyntheticSpec)
    add_flag(src, synthetic[0])
    add_flags(p, synthetic[1:])
    for opt in section_settings(BenchSpec):
        if opt.name not in _ELSEWHERE:
            add_flag(p, opt, flags=_FLAGS.get(opt.name))
    add_objective_arguments(p)
    add_flags(
        p.add_argument_group(
            "method parameters", "each is passed to every method run that takes it"
        ),
        selector_settings(),
    )
    p.add_argument(
        "--disf-batch-size",
        "--disf_batch_size",
        dest="disf_batch_size",
        type=int,
        help="disf-greedy batch size alone (--batch-size sets every method's)",
    )
    p.add_argument(
        "--param",
        action="append",
        metavar="METHOD.KEY=VALUE",
        help="extra selector argument, e.g. mask.partial=0.2 or greedy.batch_size=4; repeatable",
    )
    add_data_arguments(p)
    return p


def run_bench(args: argparse.Namespace) -> int:
    """``datamask bench``: one checked spec, then the methods run; writes bench.md,
    bench.json and the PNGs and prints the table."""
    keys = [*BenchSpec.flat_keys(), *COLUMN_KEYS, "quality_col"]
    spec = spec_from_args(args, BenchSpec, [k for k in keys if k != "columns"], ("input",))
    places = places_from_args(args, ("input",), required=())
    if spec.out_dir is None:
        raise ValueError("--output is required (the folder of bench.md, bench.json, PNGs).")
    given = vars(args)
    keys = [o.name for o in section_settings(SyntheticSpec)]
    synthetic = SyntheticSpec(**{k: given[k] for k in keys if given[k] is not None})
    if places["input"] is None and synthetic.synthetic is None:
        raise ValueError("give --input (a parquet file) or --synthetic N.")
    if places["input"] is not None and synthetic.synthetic is not None:
        raise ValueError("give --input or --synthetic, not both.")
    # The synthetic data's flags with --input: said, and not recorded (bench.json's
    # settings hold the data's own width); the bench's own are warned about by bench().
    warn_ignored_settings(synthetic.ignored(), vars(synthetic), stacklevel=2)
    data = synthetic.make() if places["input"] is None else places["input"]
    result = bench(data, spec.out_dir, spec)
    print(format_markdown(result))
    print(f"wrote {', '.join(result['files'].values())}")
    return 0
