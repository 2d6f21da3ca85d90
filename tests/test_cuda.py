"""CPU against CUDA: every term, both estimators, the swap rounding and the greedy baselines.

Skipped without CUDA. ``DATAMASK_TEST_DEVICE=cpu`` runs the same comparisons against a
second CPU copy (what the GPU kit's ``--smoke`` run does, so this file is exercised on
every machine); on a GPU machine run it as it is::

    python -m pytest tests/test_cuda.py -q

Tolerances: fp32 arithmetic in another order (CUDA reductions) moves values by about
1e-6; a selection is the same, or its J within 1e-4 (a tie broken the other way).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from datamask import MaskLearner, Objective, make_clustered
from datamask.greedy import DenseGreedy, GreedyDiSF, LazyGreedy, NaiveGreedy
from datamask.neighbors import exact_graph, knn_graph, sampled_recall
from datamask.objectives import make_term
from datamask.optim.local_search import swap_search

TARGET = os.environ.get("DATAMASK_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    TARGET.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU"
)

TERMS = ["Facility", "Pair_simi", "DiSF"]
N, DIM, K_NEIGHBORS, RATIO = 1200, 32, 48, 0.1
K = round(RATIO * N)


@pytest.fixture(scope="module")
def corpus():
    return make_clustered(N, DIM, 12, seed=5)


@pytest.fixture(scope="module")
def graph(corpus):
    """One fp32 K-NN graph built on the CPU, given to both sides, so that a difference
    below is the device's and never the graph's (the CUDA graph is tested on its own)."""
    return knn_graph(torch.as_tensor(corpus.features), K_NEIGHBORS, method="exact")


def _term(name: str, graph):
    if name == "Facility":
        return make_term(name, n_neighbors=K_NEIGHBORS, graph=graph)
    return make_term(name)


def _objective(name: str, corpus, graph, device: str) -> Objective:
    return Objective([_term(name, graph)], lamb=0.5).bind(corpus, K, device=device, seed=0)


def _same_or_close(cpu_sel, dev_sel, objective: Objective) -> None:
    """The same rows, or rows whose exact J (scored on the CPU) is within 1e-4."""
    a, b = np.sort(np.asarray(cpu_sel)), np.sort(np.asarray(dev_sel))
    assert len(a) == len(b) == K
    if not np.array_equal(a, b):
        assert abs(objective.value(a) - objective.value(b)) < 1e-4


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        a.detach().cpu().double(), b.detach().cpu().double(), rtol=rtol, atol=atol
    )


# --- objective values and gradients ----------------------------------------------------------
@pytest.mark.parametrize("name", TERMS)
def test_values_batch_values_and_expected_gradients_match(name, corpus, graph):
    cpu = _objective(name, corpus, graph, "cpu")
    dev = _objective(name, corpus, graph, TARGET)
    gen = np.random.default_rng(0)
    rows = np.sort(gen.choice(N, K, replace=False))
    assert cpu.term_values(rows).keys() == dev.term_values(rows).keys()
    for key, value in cpu.term_values(rows).items():
        assert dev.term_values(rows)[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # the reinforce estimator's rewards: the same masks scored on both devices
    batch = torch.as_tensor(np.sort(gen.choice(N, 300, replace=False)))
    masks = torch.as_tensor(gen.random((16, 300)) < RATIO, dtype=torch.float32)
    _close(cpu.batch_values(batch, masks), dev.batch_values(batch.to(TARGET), masks.to(TARGET)))
    # the expected estimator: E[J] and its gradient, on all documents and on sampled clients
    p0 = torch.as_tensor(gen.uniform(0.01, 0.3, N), dtype=torch.float32)
    clients = torch.as_tensor(gen.choice(N, 400, replace=False))
    for sample in (None, clients):
        values, grads = [], []
        for obj, where in ((cpu, "cpu"), (dev, TARGET)):
            p = p0.to(where).requires_grad_(True)
            e = obj.expected(p, None if sample is None else sample.to(where))
            (g,) = torch.autograd.grad(e, p)
            values.append(e)
            grads.append(g)
        _close(values[0], values[1])
        _close(grads[0], grads[1], atol=1e-5 * float(grads[0].abs().max()))


# --- the learner: both estimators, and its swap rounding --------------------------------------
@pytest.mark.parametrize("name", TERMS)
def test_expected_estimator_selects_the_same(name, corpus, graph):
    # partial=1: no random draw at all, so both devices run the same arithmetic
    fits = [
        MaskLearner(
            Objective([_term(name, graph)]),
            select_ratio=RATIO,
            partial=1.0,
            n_epochs=30,
            seed=0,
            device=d,
        ).fit(corpus)
        for d in ("cpu", TARGET)
    ]
    _same_or_close(fits[0].selected_, fits[1].selected_, fits[0].objective_)
    assert fits[1].terms_["J"] == pytest.approx(fits[0].terms_["J"], abs=1e-4)


def test_reinforce_estimator_runs_on_the_device(corpus, graph):
    """Its masks come from each device's own generator (torch's CPU and CUDA streams differ
    for one seed), so the two runs draw different masks: the same masks are compared in
    ``test_values_batch_values_and_expected_gradients_match``; here each run keeps exactly
    k and its J is within 1% of the other's."""
    fits = [
        MaskLearner(
            Objective([_term("Facility", graph)]),
            select_ratio=RATIO,
            estimator="reinforce",
            n_epochs=60,
            n_rollout=32,
            seed=0,
            device=d,
        ).fit(corpus)
        for d in ("cpu", TARGET)
    ]
    assert all(len(f.selected_) == K for f in fits)
    assert fits[1].terms_["J"] == pytest.approx(fits[0].terms_["J"], rel=1e-2)
    assert np.isfinite(fits[1].logits_).all()


@pytest.mark.parametrize("name", TERMS)
def test_swap_rounding_makes_the_same_swaps(name, corpus, graph):
    start = np.sort(np.argsort(-corpus.normalized_quality(), kind="stable")[:K])  # top-k
    found = []
    for d in ("cpu", TARGET):
        obj = _objective(name, corpus, graph, d)
        found.append(swap_search(obj, torch.as_tensor(start, device=d), max_rounds=50))
    cpu, dev = found
    assert dev.value == pytest.approx(cpu.value, abs=1e-4)
    assert dev.value >= dev.start
    _same_or_close(cpu.selected.cpu(), dev.selected.cpu(), _objective(name, corpus, graph, "cpu"))


# --- the greedy baselines --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("selector", "name"),
    [
        (LazyGreedy, "Facility"),
        (LazyGreedy, "Pair_simi"),
        (DenseGreedy, "Facility"),
        (NaiveGreedy, "Facility"),
        (GreedyDiSF, "DiSF"),
    ],
)
def test_greedy_baselines_select_the_same(selector, name, corpus, graph):
    fits = [
        selector(Objective([_term(name, graph)]), select_ratio=RATIO, seed=0, device=d).fit(corpus)
        for d in ("cpu", TARGET)
    ]
    _same_or_close(fits[0].selected_, fits[1].selected_, fits[0].objective_)
    assert fits[1].terms_["J"] == pytest.approx(fits[0].terms_["J"], abs=1e-4)


# --- the neighbour graph the device builds by itself ------------------------------------------
def test_device_graph_has_fp32_recall_and_similarities(corpus):
    x = torch.as_tensor(corpus.features)
    ref_idx, _ = exact_graph(x, K_NEIGHBORS, precision="fp32")
    idx, sim = knn_graph(x.to(TARGET), K_NEIGHBORS, method="auto")  # bf16 + re-rank on CUDA
    idx, sim = idx.cpu(), sim.cpu()
    hits = sum(len(set(a) & set(b)) for a, b in zip(idx.tolist(), ref_idx.tolist(), strict=True))
    assert hits / ref_idx.numel() >= 0.99
    assert sampled_recall(x, idx, n_rows=300) >= 0.99
    _close(sim, (x[:, None, :] * x[idx]).sum(-1), atol=1e-5)


# --- the searches the cover and the exchange run on the device ------------------------------
def test_cover_and_floor_searches_on_the_device_are_exact(corpus):
    from datamask.coverage import nearest_kept
    from datamask.distributed.combine.exchange import _floors

    x = torch.as_tensor(corpus.features)
    kept = np.arange(0, N, 7)
    others = x[1::5]
    want = (x @ others.T).max(dim=1)
    far = nearest_kept(x, kept_features=others, exact_pairs=0, search_device=TARGET)
    assert far.exact.all() and far.counts["exact_search"] == N
    _close(torch.from_numpy(far.sim), want.values, atol=1e-5)
    assert (far.index == want.indices.numpy()).mean() > 0.99  # a near tie may go either way
    own = nearest_kept(x, kept, exact_pairs=0, search_device=TARGET)
    best = (x @ x[kept].T).max(dim=1).values
    best[kept] = 1.0
    _close(torch.from_numpy(own.sim), best, atol=1e-5)
    floors = _floors(x, [others[:100].numpy(), others[100:].numpy()], torch.device(TARGET))
    assert floors.device.type == "cpu"
    _close(floors, want.values.clamp_min(0.0), atol=1e-5)
