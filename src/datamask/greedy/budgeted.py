"""The greedy's picks under a token budget when stale gains are not bounds (a term not
submodular), by gain per token or by gain: the naive rule, one gains call a pick."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..budget import TokenBudget
from ..objectives import Objective

__all__ = ["full_budget_picks"]


def full_budget_picks(
    objective: Objective,
    state: Any,
    budget: TokenBudget,
    *,
    per_token: bool,
    refuse: Callable[[int], bool] | None = None,
    counter: Any = None,
) -> Iterator[tuple[int, float]]:
    """:func:`~datamask.greedy.lazy.budget_picks` where stale gains are not bounds (Pair_simi,
    DiSF; or no host gains on the graph): every pick computes the gain of every row that
    still fits, in one ``objective.gains`` call, and takes the best per token
    (``per_token``) or by gain, ties to the lower row, as the naive greedy does, until no
    row fits."""
    dev = objective.device_
    sizes = torch.as_tensor(budget.sizes, dtype=torch.float64, device=dev)
    cost = sizes if per_token else torch.ones_like(sizes)
    open_ = torch.ones(len(sizes), dtype=torch.bool, device=dev)
    left = budget.total
    while True:
        open_ &= sizes <= left  # a row that no longer fits never fits again
        rest = torch.nonzero(open_).squeeze(1)
        if len(rest) == 0:
            return
        gains = objective.gains(state, rest)
        if counter is not None:
            counter.n_evaluations_ += len(rest)
        keys = gains.double() / cost[rest]
        best = int(torch.argmax(keys))  # sync point: once per pick; the first maximum
        while refuse is not None and refuse(int(rest[best])):  # conflicts with a kept row
            open_[rest[best]] = False
            keys[best] = -torch.inf
            if bool(torch.isneginf(keys).all()):
                return
            best = int(torch.argmax(keys))
        j = int(rest[best])
        state = objective.update(state, j)
        open_[j] = False
        left -= float(sizes[j])
        yield j, float(gains[best])
