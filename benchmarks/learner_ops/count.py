"""Torch operators and host syncs of the learner, per epoch and per group step (issue 43).

    PYTHONPATH=src python benchmarks/learner_ops/count.py                  # 5k, 20k, 80k
    PYTHONPATH=src python benchmarks/learner_ops/count.py --sizes 2000 --json out.json

On a GPU every aten operator is (at least) one kernel launch and every host read of a
device value (``.item()``, ``float()``, ``bool()``, ``.cpu()``, ``.tolist()``) or
data-dependent shape (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``) a device sync. Neither needs a GPU to count:
:class:`OpCounter` (a ``TorchDispatchMode``) sees every aten call on the CPU too, and
patches ``Tensor.cpu/.tolist`` (which do not dispatch on a CPU tensor) to count the host
reads they would be on CUDA (``.numpy()`` needs a ``.cpu()`` first on CUDA; on the CPU
``.cpu()`` returns the tensor itself, so ``t.cpu().tolist()`` counts two there).

A group step, as the sharded runner runs it (``fit_group(..., evaluate=False)``
then ``gain_curve``): the learner's fit (graph build, the epochs, the rounding's swap
search) and the gain order of the selection. The counts are attributed to the innermost
phase running: ``graph`` (the K-NN build), ``epoch`` (each learner step), ``swap`` (the
swap search), ``gain_order``, ``other`` (bind, init, top-k). Data: the clustered synthetic
corpus (``datamask.make_clustered``), d = 384, 50 clusters, select_ratio 0.1, seed 0.

Caveat: with a dispatch mode active, autograd's backward formulas take their
"tensor-subclass" path (``isTensorSubclassLike`` is true under a mode), which skips some
syncs the plain path has (``cumprod``'s backward checks its input for zeros with an
``.item()``). So counts of code that calls autograd are a lower bound on its syncs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import weakref
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent

#: aten operators whose output shape or value the host must read (a sync on CUDA).
SYNC_OPS = {
    "_local_scalar_dense",  # .item(), float(), int(), bool()
    "is_nonzero",
    "nonzero",
    "nonzero_static",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "equal",  # torch.equal returns a Python bool
    "allclose",
}


def _op_name(func) -> str:
    return func._schema.name.split("::")[-1]


def _is_sync(func, args, kwargs) -> bool:
    name = _op_name(func)
    if name in SYNC_OPS:
        return True
    if (
        name == "repeat_interleave"
        and "output_size" not in kwargs
        and (len(args) < 4 or args[3] is None)
    ):
        return isinstance(args[0], torch.Tensor) and args[0].dtype != torch.bool
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
        )
    return False


class OpCounter(TorchDispatchMode):
    """Counts aten operators and syncs, by phase (:meth:`phase` sets the current one)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.syncs: Counter = Counter()
        self.names: dict[str, Counter] = defaultdict(Counter)
        self.sync_names: dict[str, Counter] = defaultdict(Counter)
        self.stack = ["other"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = self.stack[-1]
        name = _op_name(func)
        if name not in ("detach", "alias"):  # views the autograd engine makes, no kernel
            self.ops[where] += 1
            self.names[where][name] += 1
        if _is_sync(func, args, kwargs):
            self.syncs[where] += 1
            self.sync_names[where][name] += 1
        return func(*args, **kwargs)

    def host_read(self, what: str) -> None:
        where = self.stack[-1]
        self.syncs[where] += 1
        self.sync_names[where][what] += 1

    @contextmanager
    def phase(self, name: str):
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()


@contextmanager
def counting():
    """An :class:`OpCounter` active, with ``Tensor.cpu/numpy/tolist`` counted as host reads."""
    counter = OpCounter()
    # .numpy() is not counted: on CUDA it needs a .cpu() first, which is.
    saved = {m: getattr(torch.Tensor, m) for m in ("cpu", "tolist")}
    on_host: dict[int, weakref.ref] = {}  # copies .cpu() made: their .tolist() is no read

    def wrap(method: str):
        original = saved[method]

        def counted(self, *a, **k):
            ref = on_host.get(id(self))
            if ref is None or ref() is not self:
                counter.host_read(f"Tensor.{method}")
            out = original(self, *a, **k)
            if method == "cpu" and isinstance(out, torch.Tensor) and out is not self:
                on_host[id(out)] = weakref.ref(out)
            return out

        return counted

    for method in saved:
        setattr(torch.Tensor, method, wrap(method))
    try:
        with counter:
            yield counter
    finally:
        for method, original in saved.items():
            setattr(torch.Tensor, method, original)


@contextmanager
def phases(counter: OpCounter, epochs: list):
    """Attribute the learner's calls to phases by wrapping them (restored on exit)."""
    from datamask.greedy import lazy
    from datamask.objectives import facility_location
    from datamask.optim import mask_learner

    patched = []

    def wrap(owner, attr, name, each=None):
        original = getattr(owner, attr)

        def wrapped(*a, **k):
            ops, syncs = counter.ops[name], counter.syncs[name]
            with counter.phase(name):
                out = original(*a, **k)
            if each is not None:
                each.append((counter.ops[name] - ops, counter.syncs[name] - syncs))
            return out

        setattr(owner, attr, wrapped)
        patched.append((owner, attr, original))

    wrap(facility_location, "knn_graph", "graph")
    make_bar = mask_learner.tqdm

    def bar(iterable, *a, **k):  # every pass of the learner's loop body is one epoch
        inner = make_bar(iterable, *a, **k)
        return _EpochBar(inner, counter, epochs)

    mask_learner.tqdm = bar
    patched.append((mask_learner, "tqdm", make_bar))
    wrap(mask_learner, "swap_search", "swap")
    wrap(lazy, "gain_order", "gain_order")
    try:
        yield
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


class _EpochBar:
    """The learner's progress bar, counting each pass of the loop body as phase ``epoch``
    (the step and its logging), its (ops, syncs) appended to ``epochs``."""

    def __init__(self, inner, counter: OpCounter, epochs: list) -> None:
        self.inner, self.counter, self.epochs = inner, counter, epochs

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __iter__(self):
        c = self.counter
        for item in self.inner:
            ops, syncs = c.ops["epoch"], c.syncs["epoch"]
            c.stack.append("epoch")
            try:
                yield item
            finally:
                c.stack.pop()
                self.epochs.append((c.ops["epoch"] - ops, c.syncs["epoch"] - syncs))


def group_step(corpus, *, ratio: float, seed: int, estimator: str, n_epochs: int | None):
    """A sharded run's group step: fit (no exact evaluation), then the gain order."""
    from datamask import MaskLearner
    from datamask.greedy.lazy import gain_order

    learner = MaskLearner(
        select_ratio=ratio, seed=seed, device="cpu", estimator=estimator, n_epochs=n_epochs
    ).fit(corpus, evaluate=False)
    order, _ = gain_order(learner.objective_, learner.selected_)
    return learner, order


def count_one(n: int, args) -> dict:
    from datamask import make_clustered

    corpus = make_clustered(n, args.dim, 50, seed=0)
    epochs: list[tuple[int, int]] = []
    with counting() as counter, phases(counter, epochs):
        learner, _ = group_step(
            corpus,
            ratio=args.ratio,
            seed=0,
            estimator=args.estimator,
            n_epochs=args.n_epochs,
        )
    per_ops = [o for o, _ in epochs]
    per_syncs = [s for _, s in epochs]
    steps = learner.n_epochs_
    return {
        "n": n,
        "k": int(learner.k_),
        "estimator": args.estimator,
        "epochs": steps,
        "epoch_ops_mean": float(np.mean(per_ops)),
        "epoch_ops_min": int(min(per_ops)),
        "epoch_ops_max": int(max(per_ops)),
        "epoch_syncs_mean": float(np.mean(per_syncs)),
        "epoch_syncs_min": int(min(per_syncs)),
        "epoch_syncs_max": int(max(per_syncs)),
        "ops": dict(counter.ops),
        "syncs": dict(counter.syncs),
        "fit_ops": int(sum(counter.ops.values())),
        "fit_syncs": int(sum(counter.syncs.values())),
        "epoch_op_names": dict(counter.names["epoch"].most_common()),
        "sync_names": {k: dict(v) for k, v in counter.sync_names.items()},
        "selected_sha": _digest(learner.selected_),
        "swaps": int(learner.swaps_),
    }


def _digest(rows: np.ndarray) -> str:
    import hashlib

    return hashlib.sha1(np.asarray(rows, dtype=np.int64).tobytes()).hexdigest()[:12]


def table(rows: list[dict]) -> str:
    phases_ = ("graph", "epoch", "swap", "gain_order", "other")
    out = [
        "| n | k | epochs | ops / epoch (min-max) | syncs / epoch (min-max) | "
        + " | ".join(f"{p} ops / syncs" for p in phases_)
        + " | fit ops | fit syncs | selection |",
        "|" + "---:|" * (7 + len(phases_)) + "---|",
    ]
    for r in rows:
        cells = [
            f"{r['n']:,}",
            f"{r['k']:,}",
            str(r["epochs"]),
            f"{r['epoch_ops_mean']:.1f} ({r['epoch_ops_min']}-{r['epoch_ops_max']})",
            f"{r['epoch_syncs_mean']:.2f} ({r['epoch_syncs_min']}-{r['epoch_syncs_max']})",
            *(f"{r['ops'].get(p, 0):,} / {r['syncs'].get(p, 0):,}" for p in phases_),
            f"{r['fit_ops']:,}",
            f"{r['fit_syncs']:,}",
            r["selected_sha"],
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000, 80000])
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--ratio", type=float, default=0.1)
    p.add_argument("--estimator", default="expected")
    p.add_argument("--n-epochs", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="write every row (with op names) here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import datamask

    where = Path(datamask.__file__).resolve().parent  # the code counted, not this script's
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=where
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "."], capture_output=True, text=True, cwd=where
    ).stdout.strip()
    commit += " (uncommitted changes)" if dirty else ""
    rows = []
    for n in args.sizes:
        started = time.perf_counter()
        rows.append(count_one(n, args))
        print(f"n={n}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(f"commit {commit}, torch {torch.__version__}, estimator {args.estimator}\n")
    print(table(rows))
    for r in rows:
        print(f"\nn={r['n']:,} epoch ops by name: {r['epoch_op_names']}")
        print(f"n={r['n']:,} syncs by phase and name: {r['sync_names']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"commit": commit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
