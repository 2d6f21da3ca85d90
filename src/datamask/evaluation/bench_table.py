"""What a bench writes: its ratios to the yardstick, the markdown table and the files.

:func:`datamask.evaluation.bench.bench` fits and scores; this module turns its runs into
``bench.md``, ``bench.json`` and, with matplotlib, the PNGs.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import Corpus
from ..io.atomic import atomic_write_json, atomic_write_text
from .bench_spec import BenchSpec

__all__ = ["YARDSTICK", "add_ratios", "format_markdown", "machine", "write_bench"]

#: The yardstick every J and time is divided by: lazy greedy on the K-NN graph.
YARDSTICK = "greedy"


def machine() -> dict[str, Any]:
    """The machine a bench ran on, as its markdown names it."""
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


def add_ratios(result: dict[str, Any]) -> None:
    """J and time relative to the yardstick (lazy greedy on the graph); DiSF loss and time
    relative to greedy DiSF."""
    by = {r["label"]: r for r in result["runs"]}
    greedy, disf = by.get(YARDSTICK), by.get("disf-greedy")
    figures: dict[str, Any] = {}
    for r in result["runs"]:
        if greedy is not None and "terms" in r:
            r["J_vs_greedy"] = r["terms"]["J"] / greedy["terms"]["J"]
            r["time_vs_greedy"] = r["seconds"] / greedy["seconds"]
        if disf is not None and "metrics" in r:
            r["disf_loss_vs_disf_greedy"] = r["metrics"]["disf_loss"] / disf["metrics"]["disf_loss"]
            r["time_saved_vs_disf_greedy"] = 1.0 - r["seconds"] / disf["seconds"]
    mask = by.get("mask")
    if mask is not None and greedy is not None:
        figures["mask_J_pct_of_greedy"] = 100.0 * mask["J_vs_greedy"]
        figures["mask_time_pct_of_greedy"] = 100.0 * mask["time_vs_greedy"]
    if mask is not None and disf is not None:
        figures["mask_time_saved_pct_vs_disf_greedy"] = 100.0 * mask["time_saved_vs_disf_greedy"]
        figures["mask_disf_loss_vs_disf_greedy"] = mask["disf_loss_vs_disf_greedy"]
    result["figures"] = figures


# --- output ---------------------------------------------------------------------------------------
def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec)


def format_markdown(result: dict[str, Any]) -> str:
    """The bench result as markdown: settings, one table, headline figures."""
    lines = [*_heading(result), *_table(result), *_redundancy_markdown(result)]
    lines += [*_disf_table(result["runs"]), *_figures(result)]
    return "\n".join(lines) + "\n"


def _heading(result: dict[str, Any]) -> list[str]:
    s, mach = result["settings"], result["machine"]
    return [
        f"# {result['title']}",
        "",
        f"N={s['n_docs']}, d={s['dim']}, {_budget_text(s)}, "
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
        + ", see `datamask.evaluation.bench`).",
        "",
    ]


def _budget_text(s: dict[str, Any]) -> str:
    """The budget as the heading says it: k documents, or the token budget every method
    kept."""
    if s.get("budget_tokens") is None:
        return f"k={s['k']} (select_ratio={s['select_ratio']})"
    ratio = s.get("select_token_ratio")
    text = (
        f"token budget {s['budget_tokens']:,.0f}"
        + (f" (select_token_ratio={ratio})" if ratio is not None else "")
        + f" of {s['corpus_tokens']:,.0f} tokens ({s['length_col']}; J per token, "
        'docs/method.md "Token budgets")'
    )
    return text


def _table(result: dict[str, Any]) -> list[str]:
    """One row per run: J and its terms, the evaluation metrics, times, memory, ratios."""
    runs = result["runs"]
    term_names = [t for t in runs[0].get("terms", {}) if t != "J"] if "terms" in runs[0] else []
    # facility coverage is the facility term's value: a column of its own only without one
    coverage = ["coverage"] if "facility" not in term_names else []
    # kept documents and tokens: where the corpus has lengths (under a token budget the
    # documents kept differ between methods)
    kept = ["kept docs", "kept tokens"] if any("tokens" in r for r in runs) else []
    head = [
        "method",
        *kept,
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
    lines = ["| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for r in runs:
        m = r.get("metrics", {})
        t = r.get("terms", {})
        cells = [
            r["label"],
            *([_fmt(r.get("k"), ","), _fmt(r.get("tokens"), ",.0f")] if kept else []),
            _fmt(t.get("J"), ".4f"),
            *[_fmt(t.get(n), ".4f") for n in term_names],
            *[_fmt(m.get("facility_coverage"), ".4f") for _ in coverage],
            _fmt(m.get("mean_pairwise_similarity"), ".4f"),
            _fmt(m.get("disf_loss"), ".1f"),
            _fmt(m.get("mean_nn_similarity"), ".4f"),
            _fmt(r.get("seconds"), ".2f"),
            _fmt(r.get("graph_seconds"), ".2f"),
            _fmt(r.get("optimise_seconds"), ".2f"),
            _fmt(r.get("cpu_seconds"), ".1f"),
            _fmt(r.get("load_after"), ".1f"),
            _fmt(r.get("peak_mb"), ".0f"),
            _fmt(100 * r["J_vs_greedy"], ".2f") + "%" if "J_vs_greedy" in r else "-",
            _fmt(100 * r["time_vs_greedy"], ".1f") + "%" if "time_vs_greedy" in r else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _disf_table(runs: list[dict[str, Any]]) -> list[str]:
    """DiSF loss and time against greedy DiSF."""
    extra = [r for r in runs if "disf_loss_vs_disf_greedy" in r]
    if not extra:
        return []
    lines = [
        "",
        "| method | DiSF loss / greedy DiSF | time saved vs greedy DiSF |",
        "|---|---:|---:|",
    ]
    for r in extra:
        lines.append(
            f"| {r['label']} | {r['disf_loss_vs_disf_greedy']:.4f} | "
            f"{100 * r['time_saved_vs_disf_greedy']:.1f}% |"
        )
    return lines


def _figures(result: dict[str, Any]) -> list[str]:
    """The headline figures and the PNGs."""
    lines: list[str] = []
    if result.get("figures"):
        lines += ["", "Headline figures:", ""]
        for key, value in result["figures"].items():
            lines.append(f"- `{key}`: {value:.4g}")
    files = result.get("files", {})
    pngs = [v for k, v in files.items() if k.endswith("png")]
    if pngs:
        lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    return lines


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


def write_bench(result: dict[str, Any], corpus: Corpus, spec: BenchSpec) -> dict[str, str]:
    """Write the PNGs (with ``spec.plots``), ``bench.md`` and ``bench.json`` into
    ``spec.out_dir``; returns the files written, by kind."""
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if spec.plots:
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
                method=spec.map_method,
                max_points=spec.map_points,
                seed=spec.seed,
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
