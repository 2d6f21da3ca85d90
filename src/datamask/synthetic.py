"""Generated corpora with known structure, for tests and benchmarks."""

from __future__ import annotations

import numpy as np

from .data import Corpus

__all__ = ["make_clustered"]


def make_clustered(
    n_docs: int = 10_000,
    dim: int = 384,
    n_clusters: int = 50,
    *,
    spread: float = 0.6,
    seed: int = 0,
) -> Corpus:
    """Unit embeddings around ``n_clusters`` random centres, with cluster-dependent quality.

    Cluster sizes follow a Zipf-like law, each cluster has its own mean quality, and the
    best clusters are small, so top-k quality piles into a few tight clusters (as it does on
    real web data). ``spread`` is the noise norm relative to the unit centre.
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    labels = rng.choice(n_clusters, size=n_docs, p=weights / weights.sum())
    noise = rng.standard_normal((n_docs, dim)) * (spread / np.sqrt(dim))
    x = centres[labels] + noise
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cluster_quality = rng.beta(2.0, 2.0, size=n_clusters)
    cluster_quality[np.argsort(weights)[: n_clusters // 5]] += 0.3  # rare clusters score high
    quality = cluster_quality[labels] + 0.15 * rng.standard_normal(n_docs)
    ids = np.array([f"doc-{i:08d}" for i in range(n_docs)], dtype=object)
    return Corpus(ids=ids, quality=quality, features=x.astype(np.float32), source="synthetic")
