"""Side-by-side benchmark: several selectors on the same data and the same objective.

    datamask bench --synthetic 10000 --out-dir out/bench
    datamask bench --input docs.parquet --methods mask greedy topk random --out-dir out/bench

Writes ``bench.md`` and ``bench.json`` (objective, every term, the evaluation metrics, wall
time and peak memory per method) and, with matplotlib, ``curve.png`` (the learner's
running objective against the greedy value), ``objective_vs_time.png`` and ``map.png``
(a 2-D PCA or t-SNE map of the data with each method's selection).

How memory is measured. Each method runs in a fresh process (``isolate=True``, the
default; spawned, so it shares no allocator state with the others). Right before ``fit``
the process resets its peak-RSS counter (``echo 5 > /proc/self/clear_refs``, Linux) and
reads its current RSS; after ``fit`` it reads the peak (``VmHWM`` in /proc/self/status).
``peak_mb`` is that peak minus the RSS before ``fit``: what fitting added on top of the
loaded corpus. Where clear_refs is unavailable a thread samples RSS every 2 ms instead
(``memory_method`` in the JSON says which). ``tracemalloc`` is not used: it cannot see
torch's allocations. On CUDA ``gpu_peak_mb`` is ``torch.cuda.max_memory_allocated``.
Wall time is the selector's own ``fit_seconds_`` (validation, binding and selection; the
final exact scoring excluded), measured inside that process and split into
``graph_seconds`` (building the K-nearest-neighbour graph) and ``optimise_seconds`` (the
rest); every method runs with the same torch/numpy thread count (``threads``);
``cpu_seconds`` is the process' user +
system CPU time over the same ``fit`` (all threads), and ``load_before``/``load_after`` the
machine's 1-minute load average around it: on a shared machine, other work inflates wall
times, and these two numbers say by how much.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .._device import set_threads
from .._memory import cpu_seconds, load_average, measure_peak_rss
from .._validation import check_corpus
from ..budget import LENGTH_COLUMNS, TokenBudget, length_column, resolve_token_budget
from ..config import SelectSpec
from ..data import Corpus
from ..io.text import lengths_from_arrow
from ..pipeline.step import fit_group
from ..settings import warn_ignored_settings
from .bench_spec import DEFAULT_METHODS, BenchSpec, method_spec
from .bench_table import YARDSTICK, add_ratios, format_markdown, machine, write_bench
from .redundancy import redundancy
from .scores import evaluate_selection

__all__ = [
    "DEFAULT_METHODS",
    "YARDSTICK",
    "BenchSpec",
    "bench",
    "format_markdown",
    "measure_peak_rss",
    "method_spec",
    "run_method",
]


# --- one method -------------------------------------------------------------------------------
def run_method(
    corpus: Corpus | str, spec: SelectSpec, threads: int | None = None
) -> dict[str, Any]:
    """Fit one selector with :func:`~datamask.pipeline.step.fit_group`, as ``select``
    does, and measure it. ``corpus`` may be the path of a saved ``.npz``; ``spec`` is the
    run's checked spec (:meth:`BenchSpec.select_spec`).

    Returns the selected rows, ``terms``, ``seconds`` (``fit_seconds_``, and its split into
    ``graph_seconds`` and ``optimise_seconds``), memory numbers, ``history`` and the
    selector's extra fitted attributes (``meta["stats"]`` of the selection). ``threads``:
    torch/numpy threads (default: the cores available).
    """
    set_threads(threads)
    if isinstance(corpus, str):
        corpus = _load_corpus(corpus)
    load_before, cpu_before = load_average(), cpu_seconds()
    (selection, _), memory = measure_peak_rss(lambda: fit_group(corpus, None, spec))
    cpu = cpu_seconds() - cpu_before
    meta = selection.meta
    if meta["gpu_peak_mb"] is not None:
        memory["gpu_peak_mb"] = meta["gpu_peak_mb"]
    out: dict[str, Any] = {
        "method": spec.selector.method,
        "selected": np.asarray(selection.selected, dtype=np.int64),
        "terms": meta["terms"],
        "seconds": float(meta["seconds"]["fit"]),
        "cpu_seconds": cpu,
        "load_before": load_before,
        "load_after": load_average(),
        "history": [dict(h) for h in meta["history"]],
        "device": meta["device"],
        "torch_threads": torch.get_num_threads(),
        **memory,
    }
    for name, value in meta["stats"].items():
        out[name] = value.item() if isinstance(value, np.generic) else value
    return out


def _save_corpus(corpus: Corpus, path: Path) -> None:
    """Write ``corpus`` as one ``.npz`` (ids as strings): how the bench hands it to the
    fresh process of each method (:func:`_load_corpus` reads it there)."""
    np.savez(
        path,
        ids=np.asarray([str(i) for i in corpus.ids]),
        quality=corpus.quality,
        features=corpus.features,
        quality_names=np.asarray(corpus.quality_names),
        quality_weights=np.asarray(corpus.quality_weights, dtype=np.float64),
        source=np.asarray(corpus.source),
        **({} if corpus.lengths is None else {"lengths": np.asarray(corpus.lengths, float)}),
    )


def _load_corpus(path: str | Path) -> Corpus:
    """Read a corpus written by :func:`_save_corpus`."""
    with np.load(path, allow_pickle=False) as z:
        return Corpus(
            ids=z["ids"].astype(object),
            quality=z["quality"],
            features=z["features"],
            quality_names=[str(s) for s in z["quality_names"]],
            quality_weights=z["quality_weights"],
            source=str(z["source"]),
            lengths=z["lengths"] if "lengths" in z.files else None,
        )


def _in_own_process(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a fresh spawned process (no allocator state shared)."""
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


# --- the bench: one run context, named phases -------------------------------------------------
@dataclass
class _Bench:
    """One bench's state as its phases fill it."""

    corpus: Corpus
    spec: BenchSpec
    threads: int = 0
    budget: TokenBudget | None = None  # the token budget every method keeps, if any
    length_col: str | None = None  # where ``corpus.lengths`` came from
    runs: list[dict[str, Any]] = field(default_factory=list)


def bench(corpus: Corpus, spec: BenchSpec | None = None, **settings: Any) -> dict[str, Any]:
    """Run several methods on ``corpus`` with one objective; tabulate, plot and save.

    Parameters
    ----------
    corpus : Corpus
        The data (validated here).
    spec : BenchSpec, optional
        Everything the bench runs with (default: from ``settings``).
    **settings
        Any setting of ``datamask bench`` by its key, instead of ``spec``
        (:meth:`BenchSpec.from_mapping`): ``methods`` (run in this order); the objective as
        ``objective=`` (an :class:`~datamask.config.ObjectiveSpec`) or as ``algorithm``,
        ``lamb``, ``n_neighbors``, ``knn``, ``n_probe``, ``term_modules``; ``select_ratio``,
        ``seed``, ``device`` (passed to every method; ``select``'s defaults, declared once);
        ``threads``; ``method_params`` (e.g. ``{"mask": {"n_epochs": 500}}``) or any
        method's parameter by name (to every method that takes it);
        ``isolate`` (each method in a fresh
        spawned process, default True); ``out_dir`` (where ``bench.md``, ``bench.json`` and
        the plots go; nothing is written when None); ``plots``; ``map_method`` ("pca" or
        "tsne") and ``map_points``; ``title``; ``progress`` (a line per finished method);
        ``dup_thresholds`` and ``dup_search`` (the near-duplicate figures,
        :mod:`datamask.evaluation.redundancy`).

    Returns
    -------
    dict
        ``settings``, ``runs`` (per method: terms, metrics, seconds, peak_mb, ratios to
        greedy), ``figures`` (headline ratios) and ``files`` written.
    """
    spec = BenchSpec.of(spec, settings, where="bench's arguments")
    run = _start(corpus, spec)
    _fit_methods(run)
    _score(run)
    result = _tabulate(run)
    if spec.out_dir is not None:
        result["files"] = write_bench(result, run.corpus, spec)
    return result


def _start(corpus: Corpus, spec: BenchSpec) -> _Bench:
    """Check the corpus and what the output needs, before any method runs; set the
    threads every method runs with."""
    corpus = check_corpus(corpus)  # unit rows for every method, the scores and the figures
    warn_ignored_settings(spec.ignored(), vars(spec), stacklevel=4)  # said, not recorded
    corpus, length_col = _with_lengths(corpus, spec)
    # one budget for every method, resolved before any runs (a corpus without lengths:
    # the error naming --length-col)
    budget = resolve_token_budget(
        corpus.lengths, spec.budget_tokens, spec.select_token_ratio, str(corpus.source)
    )
    threads = set_threads(spec.threads)
    if spec.plots and spec.out_dir is not None:
        from .plots import require_matplotlib

        require_matplotlib(tsne=spec.map_method == "tsne")
    return _Bench(corpus, spec, threads, budget=budget, length_col=length_col)


def _with_lengths(corpus: Corpus, spec: BenchSpec) -> tuple[Corpus, str | None]:
    """``corpus`` with ``lengths`` read from its length column (``spec.length_col``, else
    the first of :data:`~datamask.budget.LENGTH_COLUMNS` in ``corpus.extra``; texts count
    their characters) and the column's name; as it is where it has lengths already or no
    length column (a token budget then refused by the budget's own error)."""
    if corpus.lengths is not None:
        return corpus, spec.length_col
    names = list(corpus.extra)
    if spec.length_col is None and not any(c in names for c in LENGTH_COLUMNS):
        return corpus, None
    name = length_column(names, spec.length_col, str(corpus.source))
    lengths = lengths_from_arrow(pa.array(corpus.extra[name]), name, str(corpus.source))
    if not spec.token_budget and not (lengths > 0).all():
        return corpus, None  # lengths to show only: a column with empty documents is not one
    return replace(corpus, lengths=lengths), name


def _fit_methods(run: _Bench) -> None:
    """Fit and time every method, each in a fresh process when ``isolate``."""
    spec = run.spec
    with tempfile.TemporaryDirectory(prefix="datamask-bench-") as tmp:
        data: Corpus | str = run.corpus
        if spec.isolate:
            data = str(Path(tmp) / "corpus.npz")
            _save_corpus(run.corpus, Path(data))
        for label in spec.methods:
            args = (data, spec.select_spec(label), run.threads)
            one = _in_own_process(run_method, *args) if spec.isolate else run_method(*args)
            one["label"] = label
            one["params"] = spec.params_of(label)
            run.runs.append(one)
            if spec.progress:
                j = one.get("terms", {}).get("J", float("nan"))
                print(f"bench: {label:<28} J={j:.4f}  {one['seconds']:.2f}s", flush=True)


def _score(run: _Bench) -> None:
    """Every selection scored with the bench's objective (the evaluation metrics, the
    length distribution and its near-duplicates)."""
    objective = run.spec.objective
    for one in run.runs:
        if "selected" in one:
            rep = evaluate_selection(
                run.corpus,
                one["selected"],
                algorithm=list(objective.algorithm),
                lamb=objective.lamb,
                device=run.spec.device,
                dup_thresholds=run.spec.dup_thresholds,
                dup_all=False,
            )
            one["metrics"] = rep["metrics"]
            if run.corpus.lengths is not None:  # kept tokens beside kept documents
                one["k"] = len(one["selected"])
                one["tokens"] = float(np.asarray(run.corpus.lengths)[one["selected"]].sum())
                if run.budget is not None:
                    one["budget_tokens"] = run.budget.total
            one["length"] = rep["length"]
            one["redundancy"] = rep["redundancy"]["selected"]


def _ignored_record(spec: BenchSpec) -> dict[str, Any]:
    """``ignored_settings``, as a select summary lists them: each setting given that this
    bench does not read, its value and why (a key present only when there is one)."""
    ignored = spec.ignored()
    if not ignored:
        return {}
    values = vars(spec)
    return {"ignored_settings": {k: {"value": values[k], "why": why} for k, why in ignored.items()}}


def _token_settings(run: _Bench) -> dict[str, Any]:
    """The token budget's settings (the budget every method kept, the corpus' tokens and
    their column); nothing without lengths."""
    spec, out = run.spec, {}
    if run.corpus.lengths is not None:
        out["length_col"] = run.length_col
        out["corpus_tokens"] = float(np.sum(run.corpus.lengths))
    if run.budget is not None:
        out["budget_tokens"] = run.budget.total
        out["select_token_ratio"] = spec.select_token_ratio
    return out


def _tabulate(run: _Bench) -> dict[str, Any]:
    """The result: settings, machine, runs, the whole input's near-duplicates (once, not
    per method) and the ratios to the yardstick."""
    corpus, spec, runs = run.corpus, run.spec, run.runs
    dup_all = redundancy(
        corpus.features, thresholds=spec.dup_thresholds, method=spec.dup_search, device=spec.device
    )
    result = {
        "title": spec.title or f"datamask bench on {corpus.source}",
        "settings": {
            "source": corpus.source,
            "n_docs": corpus.n_docs,
            "dim": corpus.dim,
            "select_ratio": None if run.budget is not None else spec.select_ratio,
            "k": int(len(runs[0]["selected"]))
            if "selected" in runs[0] and run.budget is None
            else None,
            **_token_settings(run),
            "algorithm": list(spec.objective.algorithm),
            "lamb": spec.objective.lamb,
            **spec.objective.all_params(),
            "term_modules": list(spec.objective.term_modules),
            "threads": run.threads,
            "seed": spec.seed,
            "device": spec.device,
            "isolate": spec.isolate,
            "methods": list(spec.methods),
            "method_params": {m: dict(p) for m, p in spec.method_params},
        },
        "machine": machine(),
        "runs": runs,
        **_ignored_record(spec),
        "redundancy_all": dup_all,
    }
    add_ratios(result)
    return result
