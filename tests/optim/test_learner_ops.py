"""A learner step's tensor operators and host syncs do not grow with the group (issue 43).

On a GPU every operator is a kernel launch and every host read a sync, so a count that
grows with the rows is a launch-bound loop; counted here on the CPU with the
``TorchDispatchMode`` of ``benchmarks/learner_ops/count.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from datamask import MaskLearner, make_clustered
from datamask.optim import mask_learner

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_ops" / "count.py"


@pytest.fixture(scope="module")
def count():
    spec = importlib.util.spec_from_file_location("learner_ops_count", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["learner_ops_count"] = module
    spec.loader.exec_module(module)
    return module


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


def _epochs(count, n: int, device: str = "cpu", **params) -> list[tuple[int, int]]:
    corpus = make_clustered(n, 16, 8, seed=0)
    epochs: list[tuple[int, int]] = []
    learner = MaskLearner(select_ratio=0.1, n_epochs=12, seed=0, device=device, **params)
    with count.counting() as counter, count.phases(counter, epochs):
        learner.fit(corpus, evaluate=False)
    assert len(epochs) == 12
    return epochs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_an_expected_step_has_no_sync_and_the_same_ops_at_any_size(count, algorithm, device):
    small, large = (_epochs(count, n, device, algorithm=algorithm) for n in (2000, 8000))
    assert {s for _, s in small + large} == {0}  # no host read inside the loop
    # the same operators at 2k and at 8k rows, step for step (a log step reads 2 more)
    assert [o for o, _ in small] == [o for o, _ in large]
    assert max(o for o, _ in large) <= 90


def test_the_counter_sees_syncs(count):
    """The mode counts what would stop a GPU: scalar reads, data-dependent shapes, .cpu()."""
    x = torch.arange(10.0)
    with count.counting() as counter:
        float(x.sum())
        torch.nonzero(x > 3)
        x[x > 3]
        x.cpu()
        x.tolist()
        x.cpu().numpy()  # .numpy() needs .cpu() first on CUDA: one read
        x * 2  # no sync
    assert counter.syncs["other"] == 6
    assert counter.ops["other"] >= 7


def test_the_budget_newton_steps_keep_k_in_expectation():
    """Three Newton steps from the last step's tau, within the last step's largest move,
    keep sum(p) within a few thousandths of a document of k, with no bisection."""
    corpus = make_clustered(3000, 16, 8, seed=0)
    residuals = []
    newton = mask_learner._budget_newton

    def watched(theta, k, tau, reach, sizes=None):
        tau, p = newton(theta, k, tau, reach, sizes)
        residuals.append(abs(float(p.sum(dtype=torch.float64)) - k))
        return tau, p

    mask_learner._budget_newton = watched
    try:
        MaskLearner(select_ratio=0.1, seed=0, device="cpu").fit(corpus, evaluate=False)
    finally:
        mask_learner._budget_newton = newton
    assert len(residuals) == 75  # ceil(300 / 4) steps
    assert np.max(residuals) < 1e-2


def test_history_is_read_once_and_keeps_its_points():
    corpus = make_clustered(600, 16, 6, seed=0)
    learner = MaskLearner(select_ratio=0.1, n_epochs=20, log_every=5, seed=0, device="cpu")
    history = learner.fit(corpus).history_
    assert [h["step"] for h in history] == [0, 5, 10, 15, 19]
    assert all(isinstance(h["objective"], float) for h in history)
    assert all(b["seconds"] >= a["seconds"] for a, b in zip(history, history[1:], strict=False))
