"""The GPU kit's sharded figures: ``run_selection`` over generated shards (1M x 384 and
500k x 1536 by default), documents/s per GPU, and a timeline of the files each phase wrote."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch
from kit_common import Recorder, Sizes, shard_folder


class OutputTimeline:
    """Files under each folder of a sharded run's output, read every ``every`` seconds in
    a thread and added to the figure's JSON (``timeline``: ``[seconds, {folder: files}]``
    whenever a count changes), so a run stopped at its cap still says which phase it was
    in and how far each had come."""

    def __init__(self, rec: Recorder, out: Path, every: float = 2.0) -> None:
        self.rec, self.out, self.every = rec, out, every
        self.start = time.perf_counter()
        self.seen: dict[str, int] = {}
        self.timeline: list[list[Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for folder, _, files in os.walk(self.out):
            rel = os.path.relpath(folder, self.out).split(os.sep)
            key = "/".join(rel[:2])  # _work/<phase folder>, or an output folder
            counts[key] = counts.get(key, 0) + len(files)
        return counts

    def _loop(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def sample(self) -> None:
        try:
            counts = self._counts()
        except OSError:  # a folder renamed while it was read: the next sample counts it
            return
        changed = {k: v for k, v in counts.items() if self.seen.get(k) != v}
        if changed:
            self.seen.update(changed)
            self.timeline.append([round(time.perf_counter() - self.start, 1), changed])
            self.rec.add(timeline=self.timeline[-300:])

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self.sample()


def _sharded(
    rec: Recorder, device: torch.device, sizes: Sizes, args, n: int, dim: int, workers: int
) -> float:
    from datamask.config import SelectSpec
    from datamask.distributed import LocalRunner, run_selection
    from datamask.distributed.manifest import step_seconds

    work = Path(args.work)
    for old in work.glob("shards-*"):  # one corpus on disk at a time (10M x 1536 is 61 GB)
        if old.name != f"shards-{n}x{dim}":
            shutil.rmtree(old, ignore_errors=True)
    data, out = work / f"shards-{n}x{dim}", work / f"sharded-{n}x{dim}-out"
    generated = shard_folder(data, n, dim, sizes)
    shutil.rmtree(out, ignore_errors=True)
    rec.add(
        n=n,
        dim=dim,
        generate_seconds=round(generated, 3),
        workers=workers,
        chunk_size=sizes.chunk_size or None,
        output=str(out),
        select_started_s=round(time.perf_counter() - rec.start, 3),
    )
    settings: dict[str, Any] = {"select_ratio": sizes.select_ratio, "device": str(device)}
    if sizes.chunk_size:
        settings["chunk_size"] = sizes.chunk_size
    spec = SelectSpec.from_mapping({**settings, "seed": 0})
    started = time.perf_counter()
    runner = LocalRunner(workers=workers)
    watch = OutputTimeline(rec, out)  # where a cut-off run spent its time
    try:
        m = run_selection(str(data), str(out), spec, runner=runner, progress=True)
    finally:
        watch.stop()
        runner.close()
    wall = time.perf_counter() - started
    gpus = max(1, torch.cuda.device_count()) if device.type == "cuda" else 1
    t, s = m["totals"], m["summary"]
    rec.add(
        wall_seconds=round(wall, 3),
        docs_per_second=round(t["n_docs"] / wall),
        docs_per_second_per_gpu=round(t["n_docs"] / wall / gpus) if device.type == "cuda" else None,
        phases={key: round(v, 3) for key, v in t["seconds"].items() if isinstance(v, float)},
        # the plan's parts (check, k-means sample + fit, spill, gather) and the cover's
        plan_split={k: round(v, 3) for k, v in (m["partition"].get("seconds") or {}).items()},
        cover_split={
            k: round(v, 3) for k, v in ((m.get("cover") or {}).get("seconds") or {}).items()
        },
        cover_routes=(m.get("cover") or {}).get("routes"),
        n_groups=t["n_groups"],
        k=t["k"],
        group_seconds=s["group_seconds"],
        # where the group steps' time went, summed over the groups (proposals again too)
        group_phase_sums={
            key: round(sum(step_seconds(g, key) for g in m["groups"]), 3)
            for key in ("read", "fit_graph", "fit_optimise", "fit_gain_order", "write", "total")
        },
        gpu_peak_mb_per_worker=s["gpu_peak_mb_per_worker"],
        peak_rss_mb_per_worker=s["peak_rss_mb_per_worker"],
        devices=s["devices"],
        J=(m.get("terms") or {}).get("J"),
        selection_digest=m.get("selection_digest"),
        met=device.type == "cuda" and t["n_docs"] / wall / gpus >= 200_000,
    )
    if not args.keep_data:
        shutil.rmtree(data, ignore_errors=True)
    return wall


def fig_sharded_384(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    _sharded(rec, device, sizes, args, sizes.sharded_n, sizes.dim, sizes.workers)


def fig_sharded_384_cpu(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    """The same selection as ``sharded-384`` on the same machine's CPU cores only
    (``cpu_workers`` workers, ``--device cpu``); with ``sharded-384``'s JSON beside it, the
    GPU run's speed-up over this one (issue 43: >= 6x)."""
    wall = _sharded(
        rec, torch.device("cpu"), sizes, args, sizes.sharded_n, sizes.dim, sizes.cpu_workers
    )
    gpu = Path(args.results) / "sharded-384.json"
    gpu_wall = json.loads(gpu.read_text()).get("wall_seconds") if gpu.exists() else None
    if gpu_wall:
        rec.add(gpu_speedup=round(wall / gpu_wall, 3), met=wall / gpu_wall >= 6.0)
    else:
        rec.add(gpu_speedup=None, met=None)


def fig_sharded_1536(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    _sharded(rec, device, sizes, args, sizes.sharded_wide_n, sizes.wide_dim, sizes.workers)
