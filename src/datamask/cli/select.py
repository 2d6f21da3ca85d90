"""``datamask select``: flags and config file -> one :class:`~datamask.config.SelectSpec` ->
:func:`datamask.api.select`.

    datamask select --input docs.parquet --output out/selection.parquet
    datamask select --input 'data/*.parquet' --output out/sel --select-ratio 0.1
    datamask select --input data/ --output out/sel --partition cluster --n-clusters 64
    datamask select --input data/ --output out/sel --ray-address auto --workers 8

A parquet file gives ``--output`` as a parquet of every row with its rank and a summary
beside it; a folder or glob of shards gives a folder (``selected/part-*.parquet`` and
``manifest.json``), and rerunning the same command resumes a killed run.
"""

from __future__ import annotations

import argparse
from typing import Any

from .._units import format_mib
from ..api import select
from ..config import SelectSpec, check_settings, iter_settings, split_quality
from ..io.parquet import summary_path
from .args import add_select_arguments

__all__ = ["add_select_parser", "run_select", "spec_from_args"]

#: Keys a config file may hold besides the settings: where to read and write.
_PLACES = ("input", "output", "split")


def add_select_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "select",
        help="select a subset of a corpus (parquet in, parquet out)",
        description="Select round(select_ratio * N) documents that maximise "
        "lamb * quality + (1 - lamb) * diversity.",
    )
    p.add_argument("--config", help="YAML or TOML file with any of these settings (flags win)")
    p.add_argument("--input", help="parquet file, or a directory / glob of shards")
    p.add_argument("--output", help="output parquet path (a folder for shards)")
    add_select_arguments(p)
    return p


def spec_from_args(args: argparse.Namespace) -> tuple[SelectSpec, dict[str, Any]]:
    """Flags over config file over defaults: the spec, and where to read and write
    (``input``, ``output``, ``split``, and whether ``partition`` was asked for).

    The config file was read once, before the parser was built (its ``term_modules`` add
    flags): ``args.config_values`` holds its settings.
    """
    config = dict(getattr(args, "config_values", None) or {})
    places = {key: config.pop(key, None) for key in _PLACES}
    places["partition_given"] = args.partition is not None or "partition" in config
    check_settings(config, where=f"config file {args.config!r}")  # errors name the file
    config = split_quality(config)
    given = split_quality(
        {n: getattr(args, n, None) for n in [*(o.name for _, o in iter_settings()), "quality_col"]}
    )
    if "quality_cols" in given:  # the flag's columns replace the file's, weights included
        config.pop("quality_weights", None)
    settings = {**config, **{k: v for k, v in given.items() if v is not None}}
    for key in _PLACES:
        if getattr(args, key, None) is not None:
            places[key] = getattr(args, key)
    if not places["input"]:
        raise ValueError("--input is required (a parquet file, directory or glob).")
    if not places["output"]:
        raise ValueError("--output is required (a parquet path).")
    # Column names not given (flags, config) are resolved by select(): --preset, then the
    # input's schema.
    return SelectSpec.from_mapping(settings), places


def run_select(args: argparse.Namespace) -> int:
    """``datamask select``. Returns the exit status (0)."""
    spec, places = spec_from_args(args)
    result = select(
        places["input"],
        places["output"],
        spec,
        shards=True if places["partition_given"] else None,
        split=places["split"],
    )
    if "partition" in result:  # a sharded run's manifest
        _print_manifest(result)
    else:
        _print_summary(result)
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    terms = "  ".join(f"{k}={v:.4f}" for k, v in s["terms"].items() if v is not None)
    if s["k"] in (0, s["n_docs"]):  # every document or none: no selector ran, nothing scored
        terms = terms or ("every document kept" if s["k"] else "nothing kept")
    fit = s["seconds"].get("fit")
    took = "" if fit is None else f" in {fit:.2f}s"
    print(f"selected {s['k']} of {s['n_docs']} documents with {s['method']}{took}: {terms}")
    if "tokens" in s:
        t = s["tokens"]
        print(
            f"kept {t['kept']:,.0f} of {t['corpus']:,.0f} tokens ({t['length_col']}), budget "
            f"{t['budget']:,.0f}"
        )
    also = " and keep lists" if s["keep_lists"] else ""
    print(f"wrote {s['output']}, {summary_path(s['output'])}{also}")


def _print_manifest(m: dict[str, Any]) -> None:
    t, s = m["totals"], m["summary"]
    gs = s["group_seconds"]
    print(
        f"selected {t['k']} of {t['n_docs']} documents in {t['n_groups']} groups "
        f"(partition={m['partition']['by']}, {t['groups_computed']} computed, "
        f"{t['groups_reused']} reused) in {t['seconds']['total']:.1f}s: "
        f"{t['docs_per_second']:,.0f} docs/s overall"
    )
    c = m.get("cover") or {}
    terms = c.get("objective")
    if terms:  # J over every document, from the cover: exact where the cover is
        bound = "=" if c["exact"] == c["rows"] else ">="  # a missed nearer row only adds
        print(
            f"over every document: quality={terms['quality']:.4f}  "
            f"facility{bound}{terms['facility']:.4f}  J{bound}{terms['J']:.4f} "
            f"(cover exact for {c['exact']:,} of {c['rows']:,} rows)"
        )
    line = (
        f"per group: median {gs['median']:.2f}s (min {gs['min']:.2f}, max {gs['max']:.2f}); "
        f"peak RSS per worker {format_mib(s['peak_rss_mb_per_worker'])}"
    )
    if s["gpu_peak_mb_per_worker"] is not None:
        line += f"; peak GPU memory {format_mib(s['gpu_peak_mb_per_worker'])}"
    print(line + f"; runner {m['runner']['runner']} x{m['runner'].get('workers', 1)}")
    b = m["budget"]
    if b["global_round"]:
        g = b["global_round"]
        print(
            f"global budget: {b['candidates']} candidates (oversample {b['oversample']:g}), "
            f"global round {g['seconds']['total']:.1f}s, peak RSS {format_mib(g['peak_rss_mb'])}"
        )
    if "tokens" in m["totals"]:
        t = m["totals"]["tokens"]
        print(
            f"kept {t['kept']:,.0f} of {t['corpus']:,.0f} tokens ({t['length_col']}), budget "
            f"{t['budget']:,.0f}"
        )
    print(f"wrote {m['output']['selected']}/ ({m['output']['parts']} parts) and manifest.json")
