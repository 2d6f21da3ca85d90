"""Same seed, same selection: every random draw goes through the run's seeded generators.

Above ``AUTO_EXACT_MAX`` rows on CPU the facility graph is built by the ivf (or faiss)
search, whose k-means draws random rows; the fits below change torch's and numpy's global
seeds in between and must still select exactly the same rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamask import FacilityLocation, MaskLearner, Objective
from datamask._validation import check_corpus
from datamask.data import Corpus
from datamask.neighbors import AUTO_EXACT_MAX, faiss_available, resolve_knn

N_DOCS = 25_000


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 32))
    x = centres[rng.integers(40, size=N_DOCS)] + 0.8 * rng.standard_normal((N_DOCS, 32))
    return check_corpus(
        Corpus(
            ids=np.array([f"d{i:06d}" for i in range(N_DOCS)]),
            quality=rng.random((N_DOCS, 1)),
            features=x.astype(np.float32),
        )
    )


def _fit(corpus: Corpus, knn: str) -> MaskLearner:
    objective = Objective(FacilityLocation(n_neighbors=32, knn=knn), lamb=0.5)
    return MaskLearner(
        objective, select_ratio=0.05, n_epochs=5, max_swap_rounds=20, seed=0, device="cpu"
    ).fit(corpus)


@pytest.mark.parametrize(
    "knn",
    [
        "auto",
        "ivf",
        pytest.param(
            "faiss",
            marks=pytest.mark.skipif(not faiss_available(), reason="faiss not installed"),
        ),
    ],
)
def test_two_fits_in_one_process_select_the_same_rows(corpus, knn):
    assert N_DOCS > AUTO_EXACT_MAX
    want = "ivf" if knn == "auto" else knn
    assert resolve_knn(knn, N_DOCS, torch.device("cpu")) == want
    torch.manual_seed(1)
    first = _fit(corpus, knn)
    torch.manual_seed(12345)
    np.random.seed(12345)  # noqa: NPY002  (the global state must not matter)
    torch.rand(1000)  # and move it on
    second = _fit(corpus, knn)
    (term,) = (t for _, t in second.objective_.terms if t.has_graph)
    assert term.graph_method_ == want
    assert np.array_equal(first.selected_, second.selected_)
    assert np.array_equal(first.logits_, second.logits_)


def test_the_ivf_graph_follows_the_run_seed():
    """The k-means draws come from the context's generator: the same seed builds the same
    graph whatever the global state, another seed (usually) another one."""
    rng = np.random.default_rng(1)
    n = 3000
    corpus = check_corpus(
        Corpus(
            ids=np.arange(n).astype(str),
            quality=rng.random((n, 1)),
            features=rng.standard_normal((n, 16)).astype(np.float32),
        )
    )

    def graph(seed: int) -> torch.Tensor:
        term = FacilityLocation(n_neighbors=16, knn="ivf", n_probe=1)
        Objective(term).bind(corpus, 100, "cpu", seed=seed)
        return term.knn_graph()[0]

    torch.manual_seed(3)
    a = graph(0)
    torch.manual_seed(4)
    assert torch.equal(a, graph(0))
    assert not torch.equal(a, graph(1))
