"""Every objective term against a brute-force numpy computation on small inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from datamask import DiSF, FacilityLocation, Objective, PairwiseSimilarity, make_clustered
from datamask._validation import check_corpus
from datamask.objectives import correlation_loss
from datamask.objectives.combined import resolve_objective


@pytest.fixture
def bound():
    corpus = check_corpus(make_clustered(60, 8, 4, seed=1))
    return corpus


def brute_facility(x: np.ndarray, sel: np.ndarray) -> float:
    sims = x @ x[sel].T
    return float(np.mean(np.maximum(sims.max(1), 0.0)))


def brute_pairwise(x: np.ndarray, sel: np.ndarray) -> float:
    vals = [x[i] @ x[j] for i in sel for j in sel if i != j]
    return float(1.0 - np.mean(vals))


def _offdiag(z: np.ndarray) -> float:
    c = np.corrcoef(z.astype(np.float64), rowvar=False)
    return float((c**2).sum() - np.trace(c**2))


def disf_scale(x: np.ndarray, k: int, n_reference: int = 4) -> float:
    """Mean L over the same random subsets DiSF draws (torch generator seeded 0)."""
    gen = torch.Generator().manual_seed(0)
    size = min(max(k, 2), len(x))
    return float(
        np.mean(
            [
                _offdiag(x[torch.randperm(len(x), generator=gen)[:size].numpy()])
                for _ in range(n_reference)
            ]
        )
    )


def brute_disf(
    x: np.ndarray, sel: np.ndarray, corpus_x: np.ndarray | None = None, k: int | None = None
) -> float:
    """1 - L(S) / L_k, L_k the mean L of random k-subsets of the corpus (``corpus_x``)."""
    ref = x if corpus_x is None else corpus_x
    return float(1.0 - _offdiag(x[sel]) / disf_scale(ref, len(sel) if k is None else k))


def test_facility_five_points_by_hand():
    # Two unit vectors selected; the three others each take their best (clipped) similarity.
    x = np.array([[1, 0], [0, 1], [1, 0], [-1, 0], [0.6, 0.8]], dtype=np.float32)
    term = FacilityLocation().bind(torch.tensor(x), torch.zeros(5), 2)
    # rows: 1, 1, 1, max(-1, 0) = 0, max(0.6, 0.8) = 0.8  -> 3.8 / 5
    assert term.value(torch.tensor([0, 1])) == pytest.approx(3.8 / 5)


@pytest.mark.parametrize("seed", range(5))
def test_terms_match_brute_force(bound, seed):
    rng = np.random.default_rng(seed)
    sel = np.sort(rng.choice(bound.n_docs, 9, replace=False))
    x = bound.features
    obj = Objective([FacilityLocation(), PairwiseSimilarity(), DiSF()], lamb=0.4).bind(bound, 9)
    terms = obj.term_values(sel)
    q = bound.normalized_quality()
    assert terms["quality"] == pytest.approx(q[sel].mean(), abs=1e-6)
    assert terms["facility"] == pytest.approx(brute_facility(x, sel), abs=1e-5)
    assert terms["pairwise"] == pytest.approx(brute_pairwise(x, sel), abs=1e-5)
    assert terms["disf"] == pytest.approx(brute_disf(x, sel), abs=1e-4)
    expected_j = (
        0.4 * terms["quality"] + 0.6 * (terms["facility"] + terms["pairwise"] + terms["disf"]) / 3
    )
    assert terms["J"] == pytest.approx(expected_j)


def test_correlation_loss_is_the_sum_of_squared_off_diagonals(bound):
    z = bound.features[:20].astype(np.float64)
    c = np.corrcoef(z, rowvar=False)
    brute = (c**2).sum() - np.trace(c**2)
    assert correlation_loss(torch.tensor(bound.features[:20])) == pytest.approx(brute, rel=1e-3)


@pytest.mark.parametrize("term", [FacilityLocation(), PairwiseSimilarity(), DiSF()])
def test_batch_values_equal_one_value_per_mask(bound, term):
    obj = Objective(term, lamb=0.3).bind(bound, 10)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randperm(bound.n_docs, generator=gen)[:25]
    masks = (torch.rand(6, 25, generator=gen) < 0.4).float()
    masks[:, :2] = 1.0  # at least two kept rows per mask
    got = obj.batch_values(batch, masks)
    sub = obj.features_[batch]
    q = obj.quality_[batch]
    for g in range(6):
        rows = np.flatnonzero(masks[g].numpy())
        x = sub.numpy()
        if isinstance(term, FacilityLocation):
            div = brute_facility(x, rows)
        elif isinstance(term, PairwiseSimilarity):
            div = brute_pairwise(x, rows)
        else:
            div = brute_disf(x, rows, bound.features, k=10)
        want = 0.3 * float(q[rows].mean()) + 0.7 * div
        assert float(got[g]) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("term", [FacilityLocation(n_neighbors=60), PairwiseSimilarity()])
def test_expected_value_is_the_exact_expectation(term):
    """Enumerate every mask of 7 rows: E[J] under independent Bernoulli(p) in closed form."""
    corpus = check_corpus(make_clustered(7, 5, 2, seed=4))
    k = 3
    obj = Objective(term, lamb=0.5).bind(corpus, k)
    p = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.6])
    total = 0.0
    x = corpus.features
    q = corpus.normalized_quality()
    for bits in itertools.product([0, 1], repeat=7):
        m = np.array(bits, dtype=bool)
        prob = float(np.prod(np.where(m, p.numpy(), 1 - p.numpy())))
        rows = np.flatnonzero(m)
        quality = q[rows].sum() / k  # modular: the mean over the target size k
        if isinstance(term, FacilityLocation):
            div = brute_facility(x, rows) if len(rows) else 0.0
        else:
            pair = sum(x[i] @ x[j] for i in rows for j in rows if i != j)
            div = 1.0 - pair / (k * (k - 1))
        total += prob * (0.5 * quality + 0.5 * div)
    assert float(obj.expected(p)) == pytest.approx(total, abs=1e-5)


@pytest.mark.parametrize("term", [FacilityLocation(), PairwiseSimilarity(), DiSF()])
def test_greedy_gains_equal_value_differences(bound, term):
    obj = Objective(term, lamb=0.5).bind(bound, 6)
    state = obj.init_state()
    chosen: list[int] = []
    for j in [3, 17, 40]:
        chosen.append(j)
        state = obj.update(state, j)
    cands = torch.tensor([1, 5, 22, 59])
    gains = obj.gains(state, cands)
    # Greedy gains count quality and pairwise on the fixed target size k (sum / k, k (k - 1)),
    # so they equal brute-force differences of those sums, not differences of ``value``
    # (a mean over |S|); each branch checks against brute force.
    for c, g in zip(cands.tolist(), gains.tolist(), strict=True):
        if isinstance(term, PairwiseSimilarity):  # gains use the fixed target k (k - 1)
            x = bound.features
            want = 0.5 * float(obj.quality_[c]) / 6 - 0.5 * 2 * float(x[c] @ x[chosen].sum(0)) / (
                6 * 5
            )
            assert g == pytest.approx(want, abs=1e-5)
        elif isinstance(term, FacilityLocation):
            q_gain = 0.5 * float(obj.quality_[c]) / 6
            div_gain = brute_facility(bound.features, np.array([*chosen, c])) - brute_facility(
                bound.features, np.array(chosen)
            )
            assert g == pytest.approx(q_gain + 0.5 * div_gain, abs=1e-5)
        else:
            q_gain = 0.5 * float(obj.quality_[c]) / 6
            div_gain = brute_disf(bound.features, np.array([*chosen, c]), k=6) - brute_disf(
                bound.features, np.array(chosen), k=6
            )
            assert g == pytest.approx(q_gain + 0.5 * div_gain, abs=1e-4)


def test_objective_rejects_bad_lamb_and_weights():
    with pytest.raises(ValueError, match=r"lamb must be in \[0, 1\]; got 1.5"):
        Objective(FacilityLocation(), lamb=1.5)
    with pytest.raises(ValueError, match="weights must be one non-negative number per term"):
        Objective([FacilityLocation(), DiSF()], weights=[1.0])
    with pytest.raises(ValueError, match="algorithm must be one of"):
        resolve_objective(None, "Facilty", None)


class _ShiftedPairwise(PairwiseSimilarity):
    """Same ``name`` as PairwiseSimilarity, a different value."""

    def value(self, selected: torch.Tensor) -> float:
        return super().value(selected) + 0.25


def test_two_terms_with_one_name_keep_their_own_values(bound):
    """Two terms named "pairwise" with different values: each is reported under its own key
    and J is the weighted sum of both (keyed by name, the second used to hide the first)."""
    x = bound.features.astype(np.float64)
    sel = np.arange(0, 60, 7)
    objective = Objective(
        [FacilityLocation(), PairwiseSimilarity(), _ShiftedPairwise()],
        lamb=0.4,
        weights=[2.0, 1.0, 1.0],
    )
    objective.bind(bound, k=len(sel))
    values = objective.term_values(sel)
    assert list(values) == ["quality", "facility", "pairwise", "pairwise_2", "J"]
    pairwise = brute_pairwise(x, sel)
    assert values["pairwise"] == pytest.approx(pairwise, abs=1e-5)
    assert values["pairwise_2"] == pytest.approx(pairwise + 0.25, abs=1e-5)
    q = float(bound.normalized_quality()[sel].mean())
    expected = 0.4 * q + 0.6 * (
        0.5 * brute_facility(x, sel) + 0.25 * pairwise + 0.25 * (pairwise + 0.25)
    )
    assert values["J"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("bad", [-1, 300])
def test_a_given_graph_naming_no_row_is_refused_at_bind(bad):
    corpus = check_corpus(make_clustered(300, 8, 4, seed=0))
    idx = torch.arange(300)[:, None].repeat(1, 8)
    idx[7, 3] = bad  # one entry outside the corpus
    sim = torch.ones(300, 8)
    objective = Objective([FacilityLocation(graph=(idx, sim), n_neighbors=8)], lamb=0.5)
    with pytest.raises(ValueError, match=r"graph indices must be rows of the corpus, in \[0, 300"):
        objective.bind(corpus, 30, device="cpu", seed=0)
