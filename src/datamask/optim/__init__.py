"""Optimisers: the DATAMASK mask learner and the swap search that rounds its logits."""

from .local_search import SwapResult, graph_objective, swap_objective, swap_search
from .mask_learner import ESTIMATORS, INITS, MaskLearner, top_k_rows

__all__ = [
    "ESTIMATORS",
    "INITS",
    "MaskLearner",
    "SwapResult",
    "graph_objective",
    "swap_objective",
    "swap_search",
    "top_k_rows",
]
