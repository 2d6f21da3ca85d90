"""The cost model of docs/scale.md ("A costed plan"): calibrate on one run, predict others.

    python benchmarks/scale/plan.py \\
        --calibrate benchmarks/scale/results/2026-11-26-cpu2-200k-tp-default.json \\
        --check benchmarks/scale/results/2026-11-26-cpu2-1m-tp-default.json
    python benchmarks/scale/plan.py \\
        --calibrate benchmarks/scale/results/2026-11-26-cpu2-1m-tp-default.json --at 1e7 1e9 1e10

A run's figures come from ``run.py --results`` (its ``phases``: the plan phase's parts,
every group's size and seconds, the exchange steps' parts, the files and bytes each phase
wrote). W workers, groups g of n_g rows proposing c_g candidates, N documents::

    check    c_check  * N / W              every row read and checked, ids to buckets
    fit      c_fit * s * C' / P            Lloyd on s sampled rows against C' centroids
                                           (C, or k1 + C / k1 in two levels), P steps
                                           (1, or W when spread: kmeans.fit_plan)
    spill    c_spill  * N / W              every row assigned to its leaf and written
    gather   (c_gather * N + t_open * O) / W
                                           every row read back, written as its group; O =
                                           B * S spills opened (a group's rows are in
                                           every shard; B gather steps, each opening every
                                           spill once: G before buckets, else
                                           gather.gather_buckets), t_open each
                                           (GATHER_OPEN_S)
    select   LPT_W{a * n_g ** b} + o_sel   round 1 (each group's learner, gain curve)
    exchange LPT_W{e_read n_g + e_floor n_g B_g + e_order c_g} + o_ex
             B_g = min(gid, 8) * k / G: the neighbours' kept rows its floors search
    allocate c_alloc * G + LPT_W{(1 - s_graph) a * n_g ** b : g proposes again}
                                           the driver's threshold over every group's knots,
                                           and the groups whose whole candidate list was
                                           kept select again, proposing twice as many,
                                           re-using the graph they saved (s_graph: the
                                           graph's share of the calibration's group steps;
                                           0 where it recorded none)
    write    c_write * G / W               every group's kept prefix written as its part
    cover    LPT_W{c_cover * n_g} + o_cov  both passes
    keep     c_keep * N / W                keep lists, digest, manifest (the rest)

``LPT_W`` is the makespan of those step times on W workers, longest first (the order the
runner submits them in); ``o_*`` is what the phase took beyond it (start-up, reads of the
driver). Groups are known after the plan phase (their sizes come from the clusters), so a
check predicts a larger run from its own group sizes; a plan (``--at``) takes
``N / --group-size`` groups whose sizes are spread as the calibration's were (its sizes
over their mean, repeated): the group steps cost ``n ** b`` with b > 1, so groups of the
mean size alone under-count them. ``--storage`` adds bytes per phase over an object store's
throughput and requests over its latency, and the driver's serial terms with their sizes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from pathlib import Path

import numpy as np

from datamask.distributed.plan.gather import gather_buckets
from datamask.distributed.plan.kmeans import fit_plan
from datamask.distributed.plan.partition import default_clusters
from datamask.io.shards import FOOTER_THREADS

PHASES = (
    "check",
    "fit",
    "spill",
    "gather",
    "select",
    "exchange",
    "allocate",
    "write",
    "cover",
    "keep",
)


def lpt(times: list[float], workers: int) -> float:
    """Makespan of ``times`` on ``workers`` machines, longest first (LPT)."""
    loads = [0.0] * max(1, workers)
    for t in sorted(times, reverse=True):
        heapq.heapreplace(loads, loads[0] + t)
    return max(loads)


#: Groups whose kept rows a cover step searches besides its own (cover.COVER_NEIGHBORS).
COVER_NEIGHBORS = 4


def cover_rows(k: float, groups: int) -> float:
    """Kept rows a group's cover step compares each row with: its own and up to
    COVER_NEIGHBORS other groups' (k / G each)."""
    return (1 + min(groups - 1, COVER_NEIGHBORS)) * k / groups


def measured(run: dict) -> dict[str, float]:
    """A run's wall seconds per phase (the plan phase split by its own timings)."""
    s, ph = run["seconds"], run["phases"]
    parts = ph.get("plan") or {}
    g = run.get("global_round_seconds") or {}
    cover = s.get("cover", 0.0)
    out = {
        "fit": parts.get("fit", 0.0),
        "spill": parts.get("spill", 0.0),
        "gather": parts.get("gather", 0.0),
        "select": s["select"],
        "exchange": g.get("exchange", 0.0),
        "allocate": g.get("allocate", 0.0),  # the driver's threshold (both passes)
        "write": s["global"] - g.get("exchange", 0.0) - g.get("allocate", 0.0),  # parts
        "cover": cover,
    }
    out["check"] = s["plan"] - out["fit"] - out["spill"] - out["gather"]
    out["keep"] = s["total"] - s["plan"] - s["select"] - s["global"] - cover
    out["total"] = s["wall_incl_ray_start"]
    return out


def _exchange_parts(run: dict) -> list[tuple[float, float, float, float]]:
    """(n_g, B_g, c_g, seconds) of every exchange step that searched floors."""
    groups = {g["gid"]: g for g in run["phases"]["groups"]}
    k, n_groups = run["k"], run["n_groups"]
    rows = []
    for e in run["phases"]["exchange"]:
        if "floors" not in e["seconds"]:
            continue  # no lower neighbour: the first order stands
        n = groups[e["gid"]]["n"]
        rows.append((n, min(e["gid"], 8) * k / n_groups, e["candidates"], e["seconds"]))
    return rows


#: Seconds a gather step spends per spill it opens (footer, offsets, a ranged read of the
#: group's rows there), apart from the rows it reads: solved from the two runs at 7edaa2e
#: (1M: 13 groups x 100 spills, gather 9.8 s; 10M: 121 x 1,000, 345.1 s; 2 workers):
#: 4.6 ms an open and 13.6 us a row. One calibration run cannot separate the two (its
#: groups all open every spill), so the open's cost is this constant.
GATHER_OPEN_S = 4.58e-3


def gather_steps(run: dict) -> int:
    """A run's gather steps: recorded since the gather runs buckets of groups; before,
    one step a group."""
    return run["phases"].get("gather_steps") or run["n_groups"]


def bucketed(run: dict) -> bool:
    """Whether a run's code gathers in buckets (it records its gather steps)."""
    return bool(run["phases"].get("gather_steps"))


def spill_opens(run: dict, shards: float, steps: float | None = None) -> float:
    """Spill opens of a gather of ``steps`` steps (default: the run's) over ``shards``
    spills, at ``run``'s code: each step opens every spill, twice in buckets (its schema,
    then its rows)."""
    steps = gather_steps(run) if steps is None else steps
    return (2 if bucketed(run) else 1) * steps * shards


def _fit(run: dict, n: float) -> tuple[int, object]:
    """The k-means clusters and :func:`~datamask.distributed.plan.kmeans.fit_plan` for ``n``
    documents with ``run``'s settings (clusters, sample, step rows)."""
    st = run["settings"]
    c = st.get("n_clusters") or default_clusters(int(n), int(st["chunk_size"]))
    return c, fit_plan(c, int(n), st.get("kmeans_sample"), int(st["kmeans_step_rows"]))


def fit_work(run: dict, n: float) -> float:
    """Row x centroid products of one Lloyd pass of the k-means fit for ``n`` documents:
    ``s * C``, or ``s * (k1 + C / k1)`` when fitted in two levels."""
    c, fp = _fit(run, n)
    return fp.n_sample * (fp.k1 + c / fp.k1 if fp.levels == 2 else c)


def fit_steps(run: dict, n: float, workers: int) -> int:
    """Steps the fit's work is spread over: 1, or ``workers`` when the sample is spread."""
    return workers if _fit(run, n)[1].spread else 1


def costs(run: dict) -> dict[str, float]:
    """Every constant of the model from one run (seconds)."""
    m, ph = measured(run), run["phases"]
    n, w, n_groups = run["n_docs"], run["workers"], run["n_groups"]
    sizes = np.array([g["n"] for g in ph["groups"]], dtype=np.float64)
    secs = np.array([g["seconds"] for g in ph["groups"]], dtype=np.float64)
    if len(set(sizes)) > 1:  # t = a n^b by least squares on the logs
        b, log_a = np.polyfit(np.log(sizes), np.log(secs), 1)
    else:
        b, log_a = 1.0, float(np.log(secs.sum() / sizes.sum()))
    c = {
        "check": m["check"] * w / n,
        "fit": m["fit"] * fit_steps(run, n, w) / fit_work(run, n),
        "spill": m["spill"] * w / n,
        "gather": max(0.0, m["gather"] * w - GATHER_OPEN_S * spill_opens(run, run["n_shards"])) / n,
        "select_a": float(np.exp(log_a)),
        "select_b": float(b),
        "allocate": m["allocate"] / n_groups,
        "write": m["write"] * w / n_groups,
        "keep": m["keep"] * w / n,
    }
    c["select_o"] = m["select"] - lpt(list(c["select_a"] * sizes ** c["select_b"]), w)
    # a group proposing again re-uses its saved graph (since 21834ea): it pays the rest
    graphs = [g.get("graph") for g in ph["groups"]]
    c["graph_share"] = float(sum(graphs) / secs.sum()) if graphs and None not in graphs else 0.0
    ex = _exchange_parts(run)
    if ex:
        c["ex_read"] = sum(s["read"] + s["graph"] for *_, s in ex) / sum(r[0] for r in ex)
        c["ex_floor"] = sum(s["floors"] for *_, s in ex) / sum(r[0] * r[1] for r in ex)
        c["ex_order"] = sum(s["order"] for *_, s in ex) / sum(r[2] for r in ex)
        c["ex_o"] = m["exchange"] - lpt([s["total"] for *_, s in ex], w)
    cover = ph.get("cover") or {}
    searched = sizes * cover_rows(run["k"], n_groups)
    c["cover"] = cover.get("group_sum", 0.0) / searched.sum()
    c["cover_o"] = m["cover"] - lpt(list(c["cover"] * searched), w)
    c["fixed"] = run["seconds"]["wall_incl_ray_start"] - run["seconds"]["total"]
    return c


#: Groups that propose again in the allocation round: 22 of 121 at 10M (7edaa2e,
#: docs/scale.md, the 10M run), none at 200k and 1M. A plan (``--at``) assumes this share; a check
#: takes the groups that did from the run (their candidates doubled).
AGAIN_SHARE = 22 / 121


def proposed_again(groups: list[tuple[float, float]]) -> list[float]:
    """Sizes of a run's groups that proposed again: candidates per row above 1.5x the
    median (the allocation doubles them)."""
    ratio = float(np.median([cand / n for n, cand in groups]))
    return [n for n, cand in groups if cand / n > 1.5 * ratio]


def predict(
    c: dict[str, float],
    cal: dict,
    n: float,
    k: float,
    shards: float,
    groups: list[tuple[float, float]],
    workers: int,
    again: list[float] | None = None,
    buckets: int | None = None,
) -> dict[str, float]:
    """Seconds per phase for N = ``n`` documents in ``shards`` shards, budget ``k``,
    ``groups`` as (n_g, c_g) in group order, on ``workers`` workers, with the
    calibration run ``cal``'s settings; ``again``: the sizes of the groups that propose
    again (default: none); ``buckets``: the gather steps (default: as the code gathers,
    :func:`~datamask.distributed.plan.gather.gather_buckets`)."""
    g = len(groups)
    sizes = [a for a, _ in groups]
    if buckets is None:
        buckets = len(gather_buckets([round(s) for s in sizes], range(g), workers))
    redo = lpt(
        [(1 - c["graph_share"]) * c["select_a"] * s ** c["select_b"] for s in again or []],
        workers,
    )
    out = {
        "check": c["check"] * n / workers,
        "fit": c["fit"] * fit_work(cal, n) / fit_steps(cal, n, workers),
        "spill": c["spill"] * n / workers,
        "gather": (c["gather"] * n + GATHER_OPEN_S * spill_opens(cal, shards, buckets)) / workers,
        "select": lpt([c["select_a"] * s ** c["select_b"] for s in sizes], workers) + c["select_o"],
        "exchange": 0.0,
        "allocate": c["allocate"] * g + redo,
        "write": c["write"] * g / workers,
        "cover": lpt([c["cover"] * s * cover_rows(k, g) for s in sizes], workers) + c["cover_o"],
        "keep": c["keep"] * n / workers,
    }
    if "ex_read" in c:
        steps = [
            c["ex_read"] * s + c["ex_floor"] * s * min(i, 8) * k / g + c["ex_order"] * cand
            for i, (s, cand) in enumerate(groups)
            if i > 0
        ]
        out["exchange"] = lpt(steps, workers) + c["ex_o"]
    out["total"] = sum(out[p] for p in PHASES) + c["fixed"]
    return out


def print_check(predicted: dict[str, float], actual: dict[str, float]) -> None:
    """A markdown table: predicted and measured seconds per phase, and the error."""
    print("| phase | predicted s | measured s | error |")
    print("|---|---:|---:|---:|")
    for phase in (*PHASES, "total"):
        p, a = predicted[phase], actual[phase]
        err = f"{100 * (p / a - 1):+.0f}%" if a >= 2.0 else "(< 2 s)"
        print(f"| {phase} | {p:.1f} | {a:.1f} | {err} |")


#: The named cluster of docs/scale.md's plan (``--storage``): nodes, worker processes per node,
#: aggregate object-store throughput (bytes/s), request latency (s) and the driver's
#: listing page (keys per LIST request).
CLUSTER = {
    "nodes": 32,
    "cores": 32,
    "gpus_per_node": 8,
    "store_bytes_per_s": 32 * 1.25e9,  # 10 Gb/s of S3 per node, in-region
    "latency_s": 0.03,
    "list_page": 1000,
}


#: Requests per spill open of a gather step on object storage (the moto runs of
#: benchmarks/storage: a HEAD, then ranged GETs of the footer and the rows; a schema
#: read is fewer, counted the same).
REQUESTS_PER_OPEN = 3


#: The selection digest step per selected id: 0.08 s for the 100,000 ids of the 1M run
#: (``selection_digest_step`` on its output, warm, load 2.4), on one worker.
DIGEST_S_PER_ID = 0.8e-6


def _spills_kept(work: dict) -> bool:
    """Whether a run's folders still hold its spills (runs before 7edaa2e kept them)."""
    return work.get("clusters", {}).get("bytes", 0) > work.get("clusters/groups", {}).get(
        "bytes", 0
    )


def storage_per_doc(run: dict) -> dict[str, float]:
    """Bytes written per document by each phase (what the next phase reads back)."""
    w, o, n = run["phases"]["work"], run["phases"]["out"], run["n_docs"]

    def size(d: dict, *keys: str) -> float:
        return float(sum(d.get(k, {}).get("bytes", 0) for k in keys))

    graphs = 128 * 8 * n if w.get("exchange") else 0  # saved for the exchange, then deleted
    return {
        "input": run["phases"]["input_bytes"] / n,
        "check": size(w, "ids/bucket=*") / n,
        # the spills and offsets (groups/ is its own); since 7edaa2e the spills are
        # deleted once gathered: they held the group objects' rows, so count those bytes
        "spill": (size(w, "clusters") + (0 if _spills_kept(w) else size(w, "clusters/groups"))) / n,
        "gather": size(w, "clusters/groups") / n,
        "select": (size(w, "candidates", "groups") + size(o, "selected") + graphs) / n,
        "exchange": size(w, "exchange") / n,
        "cover": (size(w, "cover") + size(o, "covered")) / n,
        "keep": (size(w, "keep/bucket=*") + size(o, "keep", "selected")) / n,
    }


def storage_seconds(per_doc: dict[str, float], n: float) -> dict[str, float]:
    """Each phase's bytes (read + written) over the cluster's store throughput."""
    bw = CLUSTER["store_bytes_per_s"]
    reads = {  # what each phase reads, in the bytes the phases wrote
        "check": per_doc["input"],
        "spill": per_doc["input"],
        "gather": per_doc["spill"],
        "select": per_doc["gather"],
        "exchange": per_doc["gather"] + per_doc["select"],
        "cover": per_doc["gather"] + per_doc["select"] / 4,
        "keep": per_doc["cover"],
    }
    if not per_doc["exchange"]:
        reads["exchange"] = 0.0  # --budget group: no exchange round
    return {p: (reads[p] + per_doc.get(p, 0.0)) * n / bw for p in reads}


def serial_terms(
    c: dict[str, float], cal: dict, n: float, k: float, g: float, shards: float, workers: int
) -> list:
    """The driver's serial work at N = ``n``, and the work one step does alone:
    (term, its size at N, seconds)."""
    clusters, fp = _fit(cal, n)
    fit_shape = (
        f"{fp.n_sample:,} rows x C = {clusters:,}"
        + (f", two levels (k1 = {fp.k1})" if fp.levels == 2 else "")
        + (f", spread over {workers:,} steps" if fp.spread else ", one step")
    )
    lat, page = CLUSTER["latency_s"], CLUSTER["list_page"]
    listings = 9  # phases whose markers the driver lists once each
    offsets = 8.0 * (default_clusters(int(n), 100_000) + 1) * shards  # int64 per (leaf, spill)
    node_bw = CLUSTER["store_bytes_per_s"] / CLUSTER["nodes"]
    return [
        ("marker listings", f"{listings} x {g:,.0f} names", listings * math.ceil(g / page) * lat),
        (
            "spill listing + index step (S count files, serial GETs)",
            f"S = {shards:,.0f}",
            shards * lat,
        ),
        (
            "offsets table (one step writes it)",
            f"{offsets / 1e9:,.2f} GB",
            offsets / node_bw,
        ),
        (
            "k-means fit (Lloyd passes; a lone step unless spread)",
            fit_shape,
            c["fit"] * fit_work(cal, n) / fit_steps(cal, n, workers),
        ),
        ("allocation (driver, 2 passes over knots)", f"G = {g:,.0f}", c["allocate"] * g),
        (
            "neighbours by centroid (exchange + cover)",
            f"G^2 d = {g * g * 384:.1e}" if g <= 20_000 else f"ivf G^1.5 d = {g**1.5 * 384:.1e}",
            2 * (2.0 * (g / 1e4) ** 2 if g <= 20_000 else 1.7 * (g / 3e4) ** 1.5),
        ),
        ("selection digest (one step reads every kept id)", f"k = {k:,.0f}", k * DIGEST_S_PER_ID),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", type=Path, required=True)
    ap.add_argument("--check", type=Path, nargs="*", default=[])
    ap.add_argument("--at", type=float, nargs="*", default=[], help="documents to plan for")
    ap.add_argument("--group-size", type=float, help="mean group rows (the calibration's)")
    ap.add_argument("--shard-rows", type=float, help="rows per input shard (the calibration's)")
    ap.add_argument("--workers", type=int, default=None, help="default: the named cluster's")
    args = ap.parse_args()
    cal = json.loads(args.calibrate.read_text())
    c = costs(cal)
    print("calibration:", args.calibrate.name, json.dumps({k: round(v, 9) for k, v in c.items()}))
    for path in args.check:
        run = json.loads(path.read_text())
        groups = [(g["n"], g["k"]) for g in run["phases"]["groups"]]
        again = proposed_again(groups)
        p = predict(
            c,
            cal,
            run["n_docs"],
            run["k"],
            run["n_shards"],
            groups,
            run["workers"],
            again,
            gather_steps(run),
        )
        print(f"\n{args.calibrate.name} -> {path.name} ({len(again)} groups proposed again)")
        print_check(p, measured(run))
    per_doc = storage_per_doc(cal)
    group_size = args.group_size or cal["n_docs"] / cal["n_groups"]
    shard_rows = args.shard_rows or cal["n_docs"] / cal["n_shards"]
    ratio = cal["phases"]["groups"][0]["k"] / cal["phases"]["groups"][0]["n"]
    spread = np.array([gr["n"] for gr in cal["phases"]["groups"]], dtype=np.float64)
    spread /= spread.mean()  # the calibration's group sizes over their mean
    for n in args.at:
        workers = args.workers or CLUSTER["nodes"] * CLUSTER["cores"]
        g = max(1, round(n / group_size))
        k = 0.1 * n
        sizes = np.resize(spread, g) * (n / g)  # repeated to G groups, mean n / G
        sizes *= n / sizes.sum()
        groups = [(float(s), ratio * float(s)) for s in sorted(sizes, reverse=True)]
        # the largest groups are the ones that propose again (the 22 at 10M: docs/scale.md)
        again = [s for s, _ in groups[: round(AGAIN_SHARE * g)]]
        # the gather as the calibration's code ran it: buckets of groups, or one a group
        if bucketed(cal):
            buckets = len(gather_buckets([round(s) for s, _ in groups], range(g), workers))
        else:
            buckets = g
        p = predict(c, cal, n, k, n / shard_rows, groups, workers, again, buckets)
        st = storage_seconds(per_doc, n)
        # each spill a gather step opens is round trips (a HEAD, the footer, the rows),
        # FOOTER_THREADS at a time in a step (map_files), the steps side by side
        opens = spill_opens(cal, n / shard_rows, buckets)
        in_flight = workers * FOOTER_THREADS
        st["gather"] += opens * REQUESTS_PER_OPEN * CLUSTER["latency_s"] / in_flight
        print(
            f"\nN = {n:.0e}, G = {g:,}, W = {workers:,}, gather steps {buckets:,} "
            f"({opens:,.0f} spill opens): compute + storage (s)"
        )
        for phase in PHASES:
            print(f"| {phase} | {p[phase]:,.0f} | {st.get(phase, 0.0):,.0f} |")
        print(f"| total | {p['total']:,.0f} | {sum(st.values()):,.0f} |")
        for term, size, secs in serial_terms(c, cal, n, k, g, n / shard_rows, workers):
            print(f"| {term} | {size} | {secs:,.1f} s |")


if __name__ == "__main__":
    main()
