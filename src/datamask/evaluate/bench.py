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
import datetime as _dt
import multiprocessing as mp
import os
import platform
import tempfile
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._device import set_threads
from .._memory import cpu_seconds, load_average, measure_peak_rss
from .._validation import check_corpus
from ..config import ObjectiveSpec, PartitionSpec, SelectorSpec, SelectSpec, check_settings
from ..data import Corpus
from ..greedy.disf import time_reference
from ..io.atomic import atomic_write_json, atomic_write_text
from ..io.snapshot import load_corpus_npz, save_corpus_npz
from ..pipeline.step import fit_group
from ..selectors import SELECTORS
from .redundancy import DEFAULT_THRESHOLDS, check_thresholds, redundancy
from .report import evaluate_selection

__all__ = [
    "DEFAULT_METHODS",
    "bench",
    "format_markdown",
    "measure_peak_rss",
    "method_spec",
    "run_method",
]

DEFAULT_METHODS = ("mask", "greedy", "stochastic-greedy", "topk", "random")

#: The yardstick every J and time is divided by: lazy greedy on the K-NN graph.
YARDSTICK = "greedy"


# --- one method -------------------------------------------------------------------------------
def run_method(
    corpus: Corpus | str,
    method: str,
    params: dict[str, Any],
    objective_spec: ObjectiveSpec,
    threads: int | None = None,
) -> dict[str, Any]:
    """Fit one selector with :func:`~datamask.pipeline.step.fit_group`, as ``select``
    does, and measure it. ``corpus`` may be the path of a saved ``.npz``.

    Returns the selected rows, ``terms``, ``seconds`` (``fit_seconds_``, and its split into
    ``graph_seconds`` and ``optimise_seconds``), memory numbers, ``history`` and the
    selector's extra fitted attributes (``meta["stats"]`` of the selection). ``threads``:
    torch/numpy threads (default: the cores available).
    """

    set_threads(threads)

    if isinstance(corpus, str):
        corpus = load_corpus_npz(corpus)
    if method == "disf-greedy-reference":
        load_before, cpu_before = load_average(), cpu_seconds()
        est = time_reference(corpus, **params)
        est["cpu_seconds_per_batch"] = (cpu_seconds() - cpu_before) / max(est["n_batches_timed"], 1)
        return {
            "method": method,
            "estimate": est,
            "seconds": est["seconds_estimated"],
            "cpu_seconds": est["cpu_seconds_per_batch"] * est["n_batches"],
            "load_before": load_before,
            "load_after": load_average(),
        }
    spec = method_spec(objective_spec, method, params)
    load_before, cpu_before = load_average(), cpu_seconds()
    selection, memory = measure_peak_rss(lambda: fit_group(corpus, None, spec))
    cpu = cpu_seconds() - cpu_before
    meta = selection.meta
    if meta["gpu_peak_mb"] is not None:
        memory["gpu_peak_mb"] = meta["gpu_peak_mb"]
    out: dict[str, Any] = {
        "method": method,
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


def method_spec(objective: ObjectiveSpec, method: str, params: dict[str, Any]) -> SelectSpec:
    """One bench run's spec: ``method`` with ``params`` (shared settings such as ``seed`` and
    its own), scored with ``objective``; checked as ``select`` checks its spec."""
    shared = {f.name for f in fields(SelectorSpec)} - {"method", "params"}
    selector = SelectorSpec(
        method=method,
        params=tuple(sorted((k, v) for k, v in params.items() if k not in shared)),
        **{k: v for k, v in params.items() if k in shared},
    )
    one_group = PartitionSpec(budget="group")  # the whole corpus is the group: no merge round
    return SelectSpec(objective=objective, selector=selector, partition=one_group).check()


def _run_isolated(
    npz: str, method: str, params: dict[str, Any], spec: ObjectiveSpec, threads: int | None
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(run_method, npz, method, params, spec, threads).result()


# --- the bench ----------------------------------------------------------------------------------
def bench(
    corpus: Corpus,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    algorithm: str | Sequence[str] | None = None,
    lamb: float | None = None,
    select_ratio: float | None = None,
    seed: int | None = None,
    device: str | None = None,
    n_neighbors: int | None = None,
    knn: str | None = None,
    n_probe: int | None = None,
    objective: ObjectiveSpec | None = None,
    threads: int | None = None,
    method_params: dict[str, dict[str, Any]] | None = None,
    disf_reference_batches: int = 0,
    isolate: bool = True,
    out_dir: str | Path | None = None,
    plots: bool = True,
    map_method: str = "pca",
    map_points: int = 3000,
    title: str | None = None,
    progress: bool = False,
    dup_thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    dup_search: str = "auto",
) -> dict[str, Any]:
    """Run ``methods`` on ``corpus`` with one objective; tabulate, plot and save.

    Parameters
    ----------
    corpus : Corpus
        The data (validated here).
    methods : sequence of str
        ``--method`` names (see :data:`datamask.selectors.SELECTORS`), run in this order.
    algorithm, lamb, n_neighbors, knn, n_probe
        The objective every method is run and scored with.
    objective : ObjectiveSpec, optional
        The objective as a spec instead (user terms by name, with their ``term_modules``,
        imported in every isolated process too); not together with the five above.
    threads : int, optional
        torch/numpy threads of every method (default: the cores available).
    select_ratio, seed, device : optional
        Passed to every selector; each defaults to ``select``'s (0.3, 0, ``"auto"``: the
        fields of :class:`datamask.config.SelectorSpec`, declared once).
    method_params : dict, optional
        Extra constructor arguments per method, e.g. ``{"mask": {"n_epochs": 500}}``.
    disf_reference_batches : int, default=0
        When > 0 and ``disf-greedy`` is run, also time the original per-candidate loop on
        this many batches and extrapolate to all (row ``disf-greedy (original loop)``).
    isolate : bool, default=True
        Run each method in a fresh spawned process (clean memory numbers; costs an
        interpreter start per method, not counted in the times).
    out_dir : path, optional
        Where ``bench.md``, ``bench.json`` and the plots go; nothing is written when None.
    plots : bool, default=True
        Draw the PNGs (needs matplotlib; t-SNE needs scikit-learn).
    map_method : {"pca", "tsne"}, default="pca"
        Projection of the 2-D map.
    map_points : int, default=3000
        Documents drawn on the map (a seeded sample, every selected one among them kept).
    title : str, optional
        Heading of the markdown.
    progress : bool, default=False
        Print one line per finished method.
    dup_thresholds : sequence of float, default=(0.9, 0.95, 0.99)
        Cosine thresholds of the near-duplicate figures of every selection and of the
        whole input (see :mod:`datamask.evaluate.redundancy`).
    dup_search : {"auto", "exact", "ivf"}, default="auto"
        Pair search over the whole input.

    Returns
    -------
    dict
        ``settings``, ``runs`` (per method: terms, metrics, seconds, peak_mb, ratios to
        greedy), ``figures`` (headline ratios) and ``files`` written.
    """

    check_corpus(corpus)
    # The shared settings against their options, as select checks them; None: its default.
    shared = {"select_ratio": select_ratio, "seed": seed, "device": device}
    given = {k: v for k, (_, v) in check_settings(shared, where="bench's arguments").items()}
    select_ratio = given.get("select_ratio", SelectorSpec.select_ratio)
    seed = given.get("seed", SelectorSpec.seed)
    device = given.get("device", SelectorSpec.device)
    thresholds = check_thresholds(dup_thresholds)
    methods = list(methods)
    if not methods:
        raise ValueError("methods must name at least one method; got none.")
    for m in methods:
        if m not in SELECTORS:
            raise ValueError(f"method must be one of {list(SELECTORS)}; got {m!r}.")
    if map_method not in ("pca", "tsne"):
        raise ValueError(f"map_method must be 'pca' or 'tsne'; got {map_method!r}.")
    if objective is None:  # one objective factory: the spec's, checked like select's
        names = [algorithm] if isinstance(algorithm, str) else algorithm
        objective = SelectSpec.from_mapping(
            {
                "algorithm": names,
                "lamb": lamb,
                "n_neighbors": n_neighbors,
                "knn": knn,
                "n_probe": n_probe,
            }
        ).objective
    elif (algorithm, lamb, n_neighbors, knn, n_probe) != (None, None, None, None, None):
        raise ValueError(
            "give the objective either as objective= or as algorithm/lamb/n_neighbors/knn/"
            "n_probe, not both."
        )
    spec = objective
    names = list(objective.algorithm)
    lamb = objective.lamb

    threads = set_threads(threads)
    method_params = dict(method_params or {})
    unknown = sorted(set(method_params) - set(methods))
    if unknown:
        raise ValueError(f"method_params names methods not being run: {unknown}.")
    if plots and out_dir is not None:
        from .plots import require_matplotlib

        require_matplotlib(tsne=map_method == "tsne")

    common = {"select_ratio": select_ratio, "seed": seed, "device": device}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="datamask-bench-") as tmp:
        npz = str(Path(tmp) / "corpus.npz")
        if isolate:
            save_corpus_npz(corpus, Path(npz))
        todo: list[tuple[str, str, dict[str, Any]]] = [
            (m, m, {**common, **method_params.get(m, {})}) for m in methods
        ]
        if disf_reference_batches > 0 and "disf-greedy" in methods:
            ref = {
                "select_ratio": select_ratio,
                "seed": seed,
                "device": device,
                "n_batches": disf_reference_batches,
                "batch_size": method_params.get("disf-greedy", {}).get("batch_size", 1024),
            }
            todo.append(("disf-greedy (original loop)", "disf-greedy-reference", ref))
        for label, method, params in todo:
            if isolate:
                run = _run_isolated(npz, method, params, spec, threads)
            else:
                run = run_method(corpus, method, params, spec, threads)
            run["label"] = label
            run["params"] = {k: v for k, v in params.items() if k not in common}
            runs.append(run)
            if progress:
                j = run.get("terms", {}).get("J", float("nan"))
                print(f"bench: {label:<28} J={j:.4f}  {run['seconds']:.2f}s", flush=True)

    for run in runs:
        if "selected" in run:
            rep = evaluate_selection(
                corpus,
                run["selected"],
                algorithm=names,
                lamb=lamb,
                device=device,
                dup_thresholds=thresholds,
                dup_all=False,
            )
            run["metrics"] = rep["metrics"]
            run["length"] = rep["length"]
            run["redundancy"] = rep["redundancy"]["selected"]
    # Near-duplicates of the whole input: once, not per method.
    dup_all = redundancy(corpus.features, thresholds=thresholds, method=dup_search, device=device)
    result = {
        "title": title or f"datamask bench on {corpus.source}",
        "settings": {
            "source": corpus.source,
            "n_docs": corpus.n_docs,
            "dim": corpus.dim,
            "select_ratio": select_ratio,
            "k": int(len(runs[0]["selected"])) if "selected" in runs[0] else None,
            "algorithm": names,
            "lamb": lamb,
            **objective.all_params(),
            "term_modules": list(objective.term_modules),
            "threads": threads,
            "seed": seed,
            "device": device,
            "isolate": isolate,
            "methods": methods,
            "method_params": method_params,
        },
        "machine": _machine(),
        "runs": runs,
        "redundancy_all": dup_all,
    }
    _add_ratios(result)
    if out_dir is not None:
        result["files"] = _write(
            result,
            corpus,
            Path(out_dir),
            plots=plots,
            map_method=map_method,
            map_points=map_points,
            seed=seed,
        )
    return result


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _add_ratios(result: dict[str, Any]) -> None:
    """J and time relative to the yardstick (lazy greedy on the graph); DiSF loss and time
    relative to greedy DiSF."""
    by = {r["label"]: r for r in result["runs"]}
    greedy, disf = by.get(YARDSTICK), by.get("disf-greedy")
    ref = by.get("disf-greedy (original loop)")
    figures: dict[str, Any] = {}
    for r in result["runs"]:
        if greedy is not None and "terms" in r:
            r["J_vs_greedy"] = r["terms"]["J"] / greedy["terms"]["J"]
            r["time_vs_greedy"] = r["seconds"] / greedy["seconds"]
        if disf is not None and "metrics" in r:
            r["disf_loss_vs_disf_greedy"] = r["metrics"]["disf_loss"] / disf["metrics"]["disf_loss"]
            r["time_saved_vs_disf_greedy"] = 1.0 - r["seconds"] / disf["seconds"]
            if ref is not None:
                r["time_saved_vs_original_disf"] = 1.0 - r["seconds"] / ref["seconds"]
    mask = by.get("mask")
    if mask is not None and greedy is not None:
        figures["mask_J_pct_of_greedy"] = 100.0 * mask["J_vs_greedy"]
        figures["mask_time_pct_of_greedy"] = 100.0 * mask["time_vs_greedy"]
    if mask is not None and disf is not None:
        figures["mask_time_saved_pct_vs_disf_greedy"] = 100.0 * mask["time_saved_vs_disf_greedy"]
        figures["mask_disf_loss_vs_disf_greedy"] = mask["disf_loss_vs_disf_greedy"]
        if ref is not None:
            figures["mask_time_saved_pct_vs_original_disf"] = (
                100.0 * mask["time_saved_vs_original_disf"]
            )
    result["figures"] = figures


# --- output ---------------------------------------------------------------------------------------
def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def format_markdown(result: dict[str, Any]) -> str:
    """The bench result as markdown: settings, one table, headline figures."""
    s, mach = result["settings"], result["machine"]
    runs = result["runs"]
    term_names = [t for t in runs[0].get("terms", {}) if t != "J"] if "terms" in runs[0] else []
    lines = [
        f"# {result['title']}",
        "",
        f"N={s['n_docs']}, d={s['dim']}, k={s['k']} (select_ratio={s['select_ratio']}), "
        f"objective: lamb={s['lamb']} * quality + (1 - lamb) * {'+'.join(s['algorithm'])}, "
        f"seed={s['seed']}, device={s['device']}.",
        f"Machine: {mach['platform']}, {mach['cpu_count']} CPUs, torch {mach['torch']} "
        f"({mach['torch_threads']} threads), CUDA: {mach['cuda'] or 'none'}, "
        f"load average at the end {', '.join(f'{x:.1f}' for x in mach['load_average'] or [])};"
        f" {mach['date']}.",
        f"Times are each selector's `fit` wall time with {s.get('threads', '?')} threads, split "
        "into building the neighbour graph (graph s) and the rest (optimise s); the yardstick "
        "is `greedy`, lazy greedy on the learner's K-NN graph "
        "(CPU s: its process' CPU time over `fit`; "
        "load: the machine's 1-minute load average after it); peak MB is the resident memory "
        "`fit` added (fresh process per method"
        + ("" if s["isolate"] else "; here in-process")
        + ", see `datamask.evaluate.bench`).",
        "",
    ]
    # facility coverage is the facility term's value: a column of its own only without one
    coverage = ["coverage"] if "facility" not in term_names else []
    head = [
        "method",
        "J",
        *term_names,
        *coverage,
        "pair sim",
        "DiSF loss",
        "NN sim",
        "seconds",
        "graph s",
        "optimise s",
        "CPU s",
        "load",
        "peak MB",
        "J / sparse greedy",
        "time / sparse greedy",
    ]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for r in runs:
        m = r.get("metrics", {})
        t = r.get("terms", {})
        cells = [
            r["label"],
            _fmt(t.get("J"), ".4f"),
            *[_fmt(t.get(n), ".4f") for n in term_names],
            *[_fmt(m.get("facility_coverage"), ".4f") for _ in coverage],
            _fmt(m.get("mean_pairwise_similarity"), ".4f"),
            _fmt(m.get("disf_loss"), ".1f"),
            _fmt(m.get("mean_nn_similarity"), ".4f"),
            _fmt(r.get("seconds"), ".2f")
            + (" (est.)" if r.get("method") == "disf-greedy-reference" else ""),
            _fmt(r.get("graph_seconds"), ".2f"),
            _fmt(r.get("optimise_seconds"), ".2f"),
            _fmt(r.get("cpu_seconds"), ".1f"),
            _fmt(r.get("load_after"), ".1f"),
            _fmt(r.get("peak_mb"), ".0f"),
            _fmt(100 * r["J_vs_greedy"], ".2f") + "%" if "J_vs_greedy" in r else "-",
            _fmt(100 * r["time_vs_greedy"], ".1f") + "%" if "time_vs_greedy" in r else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _redundancy_markdown(result)
    extra = [r for r in runs if "disf_loss_vs_disf_greedy" in r]
    if extra:
        lines += [
            "",
            "| method | DiSF loss / greedy DiSF | time saved vs greedy DiSF"
            + (
                " | time saved vs original loop (est.)"
                if any("time_saved_vs_original_disf" in r for r in extra)
                else ""
            )
            + " |",
            "|---|---:|---:|"
            + ("---:|" if any("time_saved_vs_original_disf" in r for r in extra) else ""),
        ]
        for r in extra:
            row = (
                f"| {r['label']} | {r['disf_loss_vs_disf_greedy']:.4f} | "
                f"{100 * r['time_saved_vs_disf_greedy']:.1f}% |"
            )
            if "time_saved_vs_original_disf" in r:
                row += f" {100 * r['time_saved_vs_original_disf']:.2f}% |"
            lines.append(row)
    for r in runs:
        if r.get("method") == "disf-greedy-reference":
            e = r["estimate"]
            lines += [
                "",
                f"`disf-greedy (original loop)`: the original per-candidate loop timed "
                f"on {e['n_batches_timed']} of {e['n_batches']} batches "
                f"({e['seconds_per_batch']:.1f} s per batch), extrapolated to all.",
            ]
    if result.get("figures"):
        lines += ["", "Headline figures:", ""]
        for key, value in result["figures"].items():
            lines.append(f"- `{key}`: {value:.4g}")
    files = result.get("files", {})
    pngs = [v for k, v in files.items() if k.endswith("png")]
    if pngs:
        lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    return "\n".join(lines) + "\n"


def _redundancy_markdown(result: dict[str, Any]) -> list[str]:
    """Near-duplicates per method and in the whole input: pairs / documents / largest group
    above each threshold (SemDeDup's terms)."""
    every = result.get("redundancy_all")
    runs = [r for r in result["runs"] if "redundancy" in r]
    if every is None or not runs:
        return []
    ts = list(every["thresholds"])
    mark = ">=" if every["approximate"] else ""
    how = (
        f"the whole input by an approximate {every['method']} search (lower bounds)"
        if every["approximate"]
        else "the whole input exactly"
    )
    lines = [
        "",
        f"Near-duplicates (cosine above each threshold): pairs / documents in a pair / "
        f"largest group; selections searched exactly, {how} ({every['seconds']:.1f} s).",
        "",
        "| method | " + " | ".join(f"cos > {t}" for t in ts) + " |",
        "|---|" + "---:|" * len(ts),
    ]

    def cells(red: dict[str, Any], prefix: str = "") -> str:
        return " | ".join(
            f"{prefix}{v['pairs']} / {prefix}{v['documents']} / {prefix}{v['largest_group']}"
            for v in (red["thresholds"][t] for t in ts)
        )

    for r in runs:
        lines.append(f"| {r['label']} | {cells(r['redundancy'])} |")
    lines.append(f"| all documents | {cells(every, mark)} |")
    return lines


def _jsonable_run(run: dict[str, Any]) -> dict[str, Any]:
    out = dict(run)
    if "selected" in out:
        out["selected"] = np.asarray(out["selected"]).tolist()
    return out


def _write(
    result: dict[str, Any],
    corpus: Corpus,
    out: Path,
    *,
    plots: bool,
    map_method: str,
    map_points: int,
    seed: int,
) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if plots:
        from . import plots as P

        runs = result["runs"]
        files["curve_png"] = str(P.plot_learning_curve(runs, out / "curve.png"))
        files["objective_vs_time_png"] = str(
            P.plot_objective_vs_time(runs, out / "objective_vs_time.png")
        )
        files["map_png"] = str(
            P.plot_selection_map(
                corpus.features,
                runs,
                out / "map.png",
                method=map_method,
                max_points=map_points,
                seed=seed,
            )
        )
    files["markdown"] = str(out / "bench.md")
    files["json"] = str(out / "bench.json")
    result["files"] = files
    md = format_markdown(result)
    atomic_write_text(md, out / "bench.md")
    atomic_write_json(
        {**result, "runs": [_jsonable_run(r) for r in result["runs"]]}, out / "bench.json"
    )
    return files
