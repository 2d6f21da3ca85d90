"""Optimisers: the DATAMASK mask learner, and the swap search that rounds its logits (with
the swap protocol it owns)."""

from .local_search import SwapResult, graph_objective, swap_objective, swap_search
from .mask_learner import ESTIMATORS, INITS, MaskLearner, top_k_rows
from .swaps import SwapScoring, TermSwaps, register_swaps, swaps_for

__all__ = [
    "ESTIMATORS",
    "INITS",
    "MaskLearner",
    "SwapResult",
    "SwapScoring",
    "TermSwaps",
    "graph_objective",
    "swap_objective",
    "register_swaps",
    "swap_search",
    "swaps_for",
    "top_k_rows",
]
