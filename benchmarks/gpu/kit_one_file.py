"""The GPU kit's one-file figures on one generated 1M x 384 parquet file: ``graph`` (the
exact K-NN graph in bf16 with the fp32 re-rank: seconds, peak memory, recall@K) and
``group`` (``datamask.select`` end to end, each phase timed, then profiled)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
from kit_common import Recorder, Sizes, one_file, peak_mib, profiled, reset_peak, sync


def fig_graph(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    from datamask.io.parquet import read_corpus
    from datamask.neighbors import exact_graph, resolve_precision, sampled_recall
    from datamask.objectives.facility_location import LEARNER_MAX_NEIGHBORS, neighbors_for_ratio

    n, dim = sizes.group_n, sizes.dim
    path = one_file(Path(args.work) / f"group-{n}x{dim}.parquet", n, dim, sizes)
    corpus = read_corpus(path)
    k = neighbors_for_ratio(round(sizes.select_ratio * n), n, LEARNER_MAX_NEIGHBORS)
    x = torch.tensor(corpus.features, device=device)
    exact_graph(x[: min(n, 4096)], k)  # warm-up: kernels loaded, not timed
    precision = resolve_precision("auto", device)
    rec.add(n=n, dim=dim, k=k, precision=precision, nxn_fp32_gib=round(n * n * 4 / 2**30, 1))
    reset_peak(device)
    sync(device)
    started = time.perf_counter()
    idx, sim = exact_graph(x, k, precision=precision)
    sync(device)
    seconds = time.perf_counter() - started
    rows = min(sizes.recall_rows, n)
    recall = sampled_recall(x, idx, n_rows=rows, seed=0)
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:rows].to(device)
    fp32 = (x[pick][:, None, :] * x[idx[pick]]).sum(-1)
    rec.add(
        seconds=round(seconds, 3),
        docs_per_second=round(n / seconds),
        peak_device_mib=peak_mib(device),
        graph_mib=round(n * k * 12 / 2**20, 1),
        recall_at_k=recall,
        recall_rows=rows,
        max_sim_error_vs_fp32=float((fp32 - sim[pick]).abs().max()),
        met=recall >= 0.99,
    )
    del idx, sim
    seconds_by, recall_by = {}, {}  # the same graph built another way, for part 2's choice
    for chunk in sizes.topk_chunks:
        sync(device)
        started = time.perf_counter()
        chunked, _ = exact_graph(x, k, precision=precision, topk_chunk=chunk)
        sync(device)
        seconds_by[f"topk_chunk={chunk}"] = round(time.perf_counter() - started, 3)
        recall_by[f"topk_chunk={chunk}"] = sampled_recall(x, chunked, n_rows=rows, seed=0)
        del chunked
        rec.add(variant_seconds=seconds_by, variant_recall=recall_by)
    if precision != "fp32":  # the same graph in fp32, for the speed-up
        sync(device)
        started = time.perf_counter()
        exact_graph(x, k, precision="fp32")
        sync(device)
        rec.add(fp32_seconds=round(time.perf_counter() - started, 3))


def fig_group(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    import datamask

    n, dim = sizes.group_n, sizes.dim
    work = Path(args.work)
    path = one_file(work / f"group-{n}x{dim}.parquet", n, dim, sizes)
    warm = one_file(work / f"warmup-{sizes.warmup_n}x{dim}.parquet", sizes.warmup_n, dim, sizes)
    settings = {
        "select_ratio": sizes.select_ratio,
        "device": str(device),
        "seed": 0,
        "progress": False,
    }
    started = time.perf_counter()
    out = work / "group-out"
    shutil.rmtree(out, ignore_errors=True)
    datamask.select(str(warm), str(out / "warmup.parquet"), **settings)
    rec.add(warmup_seconds=round(time.perf_counter() - started, 3), n=n, dim=dim)
    reset_peak(device)
    started = time.perf_counter()
    summary = datamask.select(str(path), str(out / "selection.parquet"), **settings)
    wall = time.perf_counter() - started
    sec = summary["seconds"]
    exact_j, cover = sec.get("evaluate") or 0.0, sec.get("cover") or 0.0
    phases = {
        "read": sec["read"],
        "graph": sec["graph"],
        "learn_and_round": sec["optimise"],
        "exact_J": exact_j,
        "cover": cover,
        "write": sec["total"] - sec["read"] - sec["fit"] - exact_j - cover,
        "total": sec["total"],
    }
    rec.add(
        wall_seconds=round(wall, 3),
        phases={key: round(value, 3) for key, value in phases.items()},
        round_seconds=summary["stats"].get("refine_seconds"),  # inside learn_and_round
        learn_seconds=summary["stats"].get("learn_seconds"),  # the steps, inside it too
        epoch_ms=_epoch_ms(summary["stats"]),
        k=summary.get("k"),
        J=summary["terms"]["J"],
        graph=summary["graph"],
        selector_device=summary["device"],
        peak_device_mib=peak_mib(device),
        docs_per_second=round(n / wall),
        met=wall < 20.0,
    )
    if sizes.group_profile:  # where the wall time goes, function by function (not timed)
        rec.add(
            profile=profiled(lambda: datamask.select(str(path), str(out / "p.parquet"), **settings))
        )


def _epoch_ms(stats: dict) -> float | None:
    """Milliseconds a learner step took (``learn_seconds / n_epochs``), None without them."""
    if stats.get("learn_seconds") is None or not stats.get("n_epochs"):
        return None
    return round(1000 * stats["learn_seconds"] / stats["n_epochs"], 3)
