"""Baseline selectors on the learner's own objective, and the registry ``select`` uses.

Every selector has the :class:`~datamask.optim.MaskLearner` shape: parameters in
``__init__``, ``fit(corpus)`` sets ``selected_`` (sorted rows, exactly k), ``scores_``
(higher = kept first), ``terms_`` and ``fit_seconds_``.

========================  ==========================================================
``--method``              selector
========================  ==========================================================
``mask``                  :class:`~datamask.optim.MaskLearner` (DATAMASK)
``greedy``                :class:`LazyGreedy`: lazy greedy, facility location on the
                          learner's K-NN graph (the yardstick)
``greedy-dense``          :class:`DenseGreedy`: lazy greedy on all pairs (O(n^2))
``stochastic-greedy``     :class:`StochasticGreedy` (Mirzasoleiman et al. 2015)
``disf-greedy``           :class:`GreedyDiSF`, the original DiSF batched greedy
``topk``                  :class:`TopKQuality`
``random``                :class:`RandomSelector`
========================  ==========================================================
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ..optim import MaskLearner
from ._base import BaseSelector
from .disf import GreedyDiSF
from .lazy import DenseGreedy, LazyGreedy
from .naive import NaiveGreedy
from .random import RandomSelector
from .stochastic import StochasticGreedy
from .topk import TopKQuality

__all__ = [
    "SELECTORS",
    "BaseSelector",
    "DenseGreedy",
    "GreedyDiSF",
    "LazyGreedy",
    "Method",
    "NaiveGreedy",
    "RandomSelector",
    "StochasticGreedy",
    "TopKQuality",
    "make_selector",
]


class Method(StrEnum):
    """The ``--method`` names (a closed set: a typo fails instead of falling through)."""

    MASK = "mask"
    GREEDY = "greedy"
    GREEDY_DENSE = "greedy-dense"
    STOCHASTIC_GREEDY = "stochastic-greedy"
    DISF_GREEDY = "disf-greedy"
    TOPK = "topk"
    RANDOM = "random"


#: ``--method`` name -> selector class.
SELECTORS: dict[str, type] = {
    Method.MASK.value: MaskLearner,
    Method.GREEDY.value: LazyGreedy,
    Method.GREEDY_DENSE.value: DenseGreedy,
    Method.STOCHASTIC_GREEDY.value: StochasticGreedy,
    Method.DISF_GREEDY.value: GreedyDiSF,
    Method.TOPK.value: TopKQuality,
    Method.RANDOM.value: RandomSelector,
}


def make_selector(method: str | Method, **params: Any) -> Any:
    """A selector for a ``--method`` name, built with ``params``.

    Parameters
    ----------
    method : str or Method
        One of ``SELECTORS``: mask, greedy, greedy-dense, stochastic-greedy, disf-greedy,
        topk, random.
    **params
        Constructor arguments (``objective``, ``select_ratio``, ``seed``, ``device``, ...).

    Examples
    --------
    >>> from datamask.greedy import make_selector
    >>> type(make_selector("greedy", select_ratio=0.1)).__name__
    'LazyGreedy'
    """
    name = method.value if isinstance(method, Method) else method
    if name not in SELECTORS:
        raise ValueError(f"method must be one of {list(SELECTORS)}; got {method!r}.")
    return SELECTORS[name](**params)
