"""What the greedy selectors share beyond the selector base (:mod:`datamask.base`):
the pick order as scores, and the trace of the running objective."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["GreedyTrace", "pick_order_scores"]


def pick_order_scores(order: np.ndarray, n_docs: int) -> np.ndarray:
    """Scores from a pick order: the t-th pick scores ``-t``, rows never picked ``-n_docs``.

    Higher is better, so ranking by score replays the pick order.
    """
    scores = np.full(n_docs, -float(n_docs))
    scores[np.asarray(order, dtype=np.int64)] = -np.arange(len(order), dtype=np.float64)
    return scores


class GreedyTrace:
    """Records a greedy run: the pick order, and the running objective every few picks.

    The running objective is the sum of the marginal gains so far; :meth:`history` shifts
    it so that the last point equals the exact final ``J``.
    """

    def __init__(self, k: int, start: float, points: int = 50) -> None:
        self.order: list[int] = []
        self.every = max(1, k // points)
        self.k = k
        self.start = start
        self._gain_sum = 0.0
        self._points: list[dict[str, float]] = []

    def add(self, j: int, gain: float) -> None:
        self.order.append(int(j))
        self._gain_sum += float(gain)
        t = len(self.order)
        if t % self.every == 0 or t == self.k:
            self._points.append(
                {"step": t, "gain_sum": self._gain_sum, "seconds": time.perf_counter() - self.start}
            )

    def history(self, final_j: float) -> list[dict[str, float]]:
        """Per logged pick: step, running objective (J of the picks so far), seconds."""
        offset = final_j - self._gain_sum  # the objective of the empty selection
        return [
            {"step": p["step"], "objective": float(offset + p["gain_sum"]), "seconds": p["seconds"]}
            for p in self._points
        ]
