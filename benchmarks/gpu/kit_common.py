"""The GPU kit's shared helpers: sizes, each figure's JSON (:class:`Recorder`), the
machine it ran on, device syncs and peaks, and the generated data (the seeded clustered
corpus of ``benchmarks/scale/generate.py``). Imported by ``run.py`` and every figure module."""

from __future__ import annotations

import cProfile
import io
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datamask.io.atomic import atomic_write_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "scale"))
import generate  # noqa: E402  (benchmarks/scale/generate.py: the seeded clustered corpus)

DEMO = REPO / "examples" / "demo" / "demo_docs.parquet"
PACKED_MODEL = REPO / ".gpu-carry" / "minilm"
#: Every figure, in the order RESULTS.md lists them (``run.FIGURES`` maps each to its function).
FIGURE_NAMES = (
    "correctness",
    "graph",
    "group",
    "embed",
    "greedy",
    "sharded-384",
    "sharded-384-cpu",
    "sharded-1536",
)
TARGETS = {
    "graph": "recall@K >= 0.99 against fp32 exact; no n x n matrix",
    "group": "1M x 384 end to end < 20 s",
    "sharded-384": ">= 200,000 documents/s per GPU",
    "sharded-384-cpu": "the GPU run >= 6x this CPU-only run of the same selection (issue 43)",
    "sharded-1536": ">= 200,000 documents/s per GPU",
    "greedy": "J >= 100% of greedy's; optimisation time <= 10% of greedy's",
    "embed": "documents/s (no target)",
    "correctness": "every CPU/CUDA test passes",
}


@dataclass(frozen=True)
class Sizes:
    """Every size the kit runs at: the full one on a GPU, a tiny one for ``--smoke``."""

    group_n: int = 1_000_000
    dim: int = 384
    wide_dim: int = 1536
    n_clusters: int = 500
    select_ratio: float = 0.1
    recall_rows: int = 1000
    warmup_n: int = 20_000
    # 1M x 384 did not finish in 114 s on the H100 (call2): first a number and a timeline
    sharded_n: int = 1_000_000
    sharded_wide_n: int = 500_000
    shard_rows: int = 100_000
    workers: int = 8
    cpu_workers: int = 16  # sharded-384-cpu: the same machine's CPU cores, one worker each
    chunk_size: int = 0  # the sharded runs' --chunk-size (0: the library's default)
    embed_docs: int = 30_000
    embed_batches: tuple[int, ...] = (64, 512)
    topk_chunks: tuple[int, ...] = (16384,)  # the graph's two-stage top-k, timed too
    group_profile: int = 1  # after the timed group run, one more under cProfile (0: none)


SMOKE = Sizes(
    group_n=1200,
    n_clusters=20,
    wide_dim=96,
    recall_rows=100,
    warmup_n=300,
    sharded_n=2400,
    sharded_wide_n=1200,
    shard_rows=1200,
    chunk_size=1000,  # several groups, as the real runs: a corpus of one group is not clustered
    workers=1,
    cpu_workers=1,
    embed_docs=8,
    embed_batches=(8,),
    topk_chunks=(256,),
)


def sizes_of(args) -> Sizes:
    """The sizes of this run: full or ``--smoke``, then each ``--size KEY=VALUE``."""
    sizes = SMOKE if args.smoke else Sizes()
    changes: dict[str, Any] = {}
    for item in getattr(args, "size", None) or []:
        key, _, value = item.partition("=")
        field = {f.name: f for f in fields(Sizes)}.get(key)
        if field is None or not value:
            known = ", ".join(f.name for f in fields(Sizes))
            raise ValueError(f"--size takes KEY=VALUE with KEY one of {known}; got {item!r}.")
        kind = type(getattr(sizes, key))
        changes[key] = tuple(int(v) for v in value.split(",")) if kind is tuple else kind(value)
    return replace(sizes, **changes)


def describe(device: torch.device) -> dict[str, Any]:
    """The machine a figure ran on, named in every JSON."""
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        info["sm_count"] = props.multi_processor_count
    else:
        info["gpu"] = None
    return info


class Recorder:
    """One figure's JSON, rewritten (atomically) every time a step adds a number."""

    def __init__(self, name: str, results: Path, device: torch.device, sizes: Sizes) -> None:
        self.path = results / f"{name}.json"
        self.start = time.perf_counter()
        self.data: dict[str, Any] = {
            "figure": name,
            "status": "partial",
            "target": TARGETS[name],
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": describe(device),
            "sizes": asdict(sizes),
        }
        self.save()

    def add(self, **values: Any) -> None:
        self.data.update(values)
        self.data["elapsed_s"] = round(time.perf_counter() - self.start, 3)
        self.save()

    def save(self) -> None:
        atomic_write_json(self.data, self.path)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timings read the host clock after it


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def profiled(call: Callable[[], Any], lines: int = 40) -> list[str]:
    """The top ``lines`` functions by cumulative time of one ``call`` under cProfile. On
    CUDA the time of queued kernels lands on the next call that waits for them."""
    profile = cProfile.Profile()
    profile.runcall(call)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(lines)
    return [line.replace(str(REPO), ".") for line in text.getvalue().splitlines() if line.strip()]


# --- generated data ---------------------------------------------------------------------------
def one_file(path: Path, n: int, dim: int, sizes: Sizes, seed: int = 0) -> Path:
    """One parquet file of ``n`` clustered rows (reused when it exists: written atomically)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        model = generate.cluster_model(dim, sizes.n_clusters, seed)
        generate.write_shard(path, 0, n, model, np.random.SeedSequence(seed))
    return path


def shard_folder(folder: Path, n: int, dim: int, sizes: Sizes, seed: int = 0) -> float:
    """``n`` rows as shards of ``sizes.shard_rows``, written by a process pool (as
    ``generate.py`` writes them, one after the other). Returns the seconds it took."""
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    n_shards = max(1, -(-n // sizes.shard_rows))
    model = generate.cluster_model(dim, sizes.n_clusters, seed)
    seeds = np.random.SeedSequence(seed).spawn(n_shards)
    bounds = np.linspace(0, n, n_shards + 1).astype(np.int64)
    jobs = [
        (folder / f"part-{s:05d}.parquet", int(bounds[s]), int(bounds[s + 1] - bounds[s]))
        for s in range(n_shards)
    ]
    jobs = [j for j in jobs if not j[0].exists()]
    workers = min(len(jobs), os.cpu_count() or 1) if sizes.workers > 1 else 1
    if workers <= 1:  # the smoke run: no pool to start
        for p, a, m in jobs:
            generate.write_shard(p, a, m, model, seeds[int(p.stem[5:])])
        return time.perf_counter() - started
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        done = [
            pool.submit(generate.write_shard, p, a, m, model, seeds[int(p.stem[5:])])
            for p, a, m in jobs
        ]
        for f in done:
            f.result()
    return time.perf_counter() - started
