"""Fixed-bin histograms streamed batch by batch: the whole corpus, and the kept rows of
each selection (the report page's quality and length distributions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["BINS", "Histogram", "bin_edges"]

#: Bins of every histogram.
BINS = 40


@dataclass
class Histogram:
    """Counts of values over fixed bins, for the whole corpus and kept/dropped per selection."""

    edges: np.ndarray
    log: bool
    all: np.ndarray = field(init=False)
    kept: list[np.ndarray] = field(init=False)
    n_sel: int = 0

    def __post_init__(self) -> None:
        self.all = np.zeros(len(self.edges) - 1, np.int64)
        self.kept = [np.zeros(len(self.edges) - 1, np.int64) for _ in range(self.n_sel)]

    def add(self, values: np.ndarray, kept: list[np.ndarray]) -> None:
        idx = np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0, len(self.all) - 1)
        self.all += np.bincount(idx, minlength=len(self.all))
        for s, mask in enumerate(kept):
            self.kept[s] += np.bincount(idx[mask], minlength=len(self.all))


def bin_edges(lo: float, hi: float, *, log: bool) -> np.ndarray:
    """``BINS + 1`` edges over ``[lo, hi]``, even or (``log``) geometric from ``max(lo, 1)``;
    a single value gets a unit-wide range around it."""
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    if log:
        return np.geomspace(max(lo, 1.0), hi, BINS + 1)
    return np.linspace(lo, hi, BINS + 1)
