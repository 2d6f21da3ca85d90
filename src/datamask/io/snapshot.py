"""A corpus snapshot in one ``.npz`` file, for handing a corpus to another process."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data import Corpus

__all__ = ["load_corpus_npz", "save_corpus_npz"]


def save_corpus_npz(corpus: Corpus, path: str | Path) -> None:
    """Write a corpus as one ``.npz`` (ids as strings): how ``bench`` hands it to the
    fresh process of each method."""
    np.savez(
        path,
        ids=np.asarray([str(i) for i in corpus.ids]),
        quality=corpus.quality,
        features=corpus.features,
        quality_names=np.asarray(corpus.quality_names),
        quality_weights=np.asarray(corpus.quality_weights, dtype=np.float64),
        source=np.asarray(corpus.source),
    )


def load_corpus_npz(path: str | Path) -> Corpus:
    """Read a corpus written by :func:`save_corpus_npz`."""
    with np.load(path, allow_pickle=False) as z:
        return Corpus(
            ids=z["ids"].astype(object),
            quality=z["quality"],
            features=z["features"],
            quality_names=[str(s) for s in z["quality_names"]],
            quality_weights=z["quality_weights"],
            source=str(z["source"]),
        )
