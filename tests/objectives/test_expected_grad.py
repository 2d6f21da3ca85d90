"""``expected_grad``: the closed-form gradients equal autograd's, keep-probabilities of
exactly 0 and 1 included (where facility location's ``cumprod`` has zeros)."""

from __future__ import annotations

import pytest
import torch

from datamask import DiSF, FacilityLocation, Objective, PairwiseSimilarity, make_clustered
from datamask.objectives import Quality


def _reference(obj: Objective, p: torch.Tensor, clients) -> tuple[float, torch.Tensor]:
    """E[J] and dE/dp by float64 autograd of the formulas as written (no floor)."""
    pp = p.double().requires_grad_(True)
    total, extra = 0.0, torch.zeros(len(p), dtype=torch.float64)
    for w, term in obj.terms:
        if isinstance(term, FacilityLocation):
            idx, sim = term.knn_graph()
            if clients is not None:
                idx, sim = idx[clients], sim[clients]
            sim = sim.double()
            pn = pp.index_select(0, idx.reshape(-1)).view(idx.shape)
            miss = torch.cumprod(1 - pn, 1)
            before = torch.cat([torch.ones_like(miss[:, :1]), miss[:, :-1]], 1)
            cover = (sim * pn * before).sum(1)
            if idx.shape[1] < term.n_docs:
                cover = cover + sim[:, -1] * miss[:, -1]
            total = total + w * cover.mean()
        elif isinstance(term, PairwiseSimilarity):
            x, k = term.features_.double(), term.k_
            s = pp @ x
            total = total + w * (1 - (s @ s - pp @ pp) / (k * (k - 1)))
        elif isinstance(term, Quality):
            total = total + w * (pp @ term.quality_.double()) / term.k_
        else:  # DiSF: autograd of its own float32 expectation
            p32 = p.clone().requires_grad_(True)
            value = term.expected(p32, clients)
            (g32,) = torch.autograd.grad(value, p32)
            total = total + w * float(value)
            extra = extra + w * g32.double()
    (grad,) = torch.autograd.grad(total, pp)
    return float(total), grad + extra


@pytest.mark.parametrize(
    "term",
    [
        FacilityLocation(n_neighbors=24),
        FacilityLocation(n_neighbors=500),  # K = n: no unseen rest
        PairwiseSimilarity(),
        DiSF(),
    ],
    ids=["facility", "facility-all", "pairwise", "disf"],
)
@pytest.mark.parametrize("sampled", [False, True])
def test_expected_grad_matches_autograd(term, sampled):
    corpus = make_clustered(500, 16, 5, seed=1)
    obj = Objective(term, lamb=0.3).bind(corpus, 50, "cpu")
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(500, generator=gen)
    p[::7], p[3::11] = 1.0, 0.0  # sure and impossible rows
    clients = torch.randperm(500, generator=gen)[:150] if sampled else None
    value, grad = obj.expected_grad(p, clients)
    want_value, want_grad = _reference(obj, p, clients)
    assert float(value) == pytest.approx(want_value, abs=1e-5)
    assert float(value) == pytest.approx(float(obj.expected(p, clients)), abs=1e-6)
    scale = float(want_grad.abs().max())
    assert float((grad.double() - want_grad).abs().max()) <= 1e-4 * scale
    assert not p.requires_grad
