"""The report's topics: spherical k-means of the embeddings, labelled by each topic's most
distinctive frequent words."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from ..neighbors import spherical_kmeans

__all__ = ["fit_topics", "topic_words"]

_WORD = re.compile(r"[a-z][a-z'_-]{2,}")
_STOP = frozenset(
    """the and for that this with from are was were you your have has had not but all any can
    will would there their they them then than what when which who whom how why where into
    out our ours its it's about also more most some such only other over under use used using
    one two may might must should could been being each per via get got let see like just
    these those here very much many make made does did done his her she him hers him's
    i'm we've you're it's don't can't won't isn't aren't the' new set sets value values
    file files line lines name names type types true false none null return returns data
    http https www com org html""".split()  # noqa: SIM905 - a word list reads better so
)


def fit_topics(
    x: torch.Tensor, n_topics: int, gen: torch.Generator, n_init: int = 5
) -> torch.Tensor:
    """The best of ``n_init`` spherical k-means fits (highest total cosine to the centroids):
    one fit from random rows can merge two topics and split another."""
    fits = [spherical_kmeans(x, n_topics, n_iter=20, sample=None, generator=gen)]
    for _ in range(n_init - 1):
        fits.append(spherical_kmeans(x, n_topics, n_iter=20, sample=None, generator=gen))
    return max(fits, key=lambda cent: float((x @ cent.T).amax(1).sum()))


def topic_words(texts: Sequence[str], topics: np.ndarray, n_topics: int) -> list[list[str]]:
    """Most distinctive frequent words of each topic (count x log inverse topic frequency)."""
    counts = [Counter() for _ in range(n_topics)]
    for text, t in zip(texts, topics, strict=True):
        words = [w.strip("'-_") for w in _WORD.findall(text.lower())]
        counts[int(t)].update(w for w in words if len(w) > 2 and w not in _STOP)
    spread = Counter(w for c in counts for w in c)
    out = []
    for c in counts:
        scored = sorted(
            c.items(), key=lambda kv: (-kv[1] * np.log(1 + n_topics / spread[kv[0]]), kv[0])
        )
        out.append([w for w, _ in scored[:4]])
    return out
