"""The selector registry: every ``--method`` name and the class that runs it.

Every selector has the :class:`~datamask.optim.MaskLearner` shape: parameters in
``__init__``, ``fit(corpus)`` sets ``selected_`` (sorted rows, exactly k), ``scores_``
(higher = kept first), ``terms_`` and ``fit_seconds_``.

=====================  =============================================================
``--method``           selector
=====================  =============================================================
``mask``               :class:`~datamask.optim.MaskLearner` (DATAMASK)
``greedy``             :class:`~datamask.greedy.LazyGreedy`: lazy greedy, facility
                       location on the learner's K-NN graph (the yardstick)
``greedy-dense``       :class:`~datamask.greedy.DenseGreedy`: on all pairs (O(n^2))
``stochastic-greedy``  :class:`~datamask.greedy.StochasticGreedy` (Mirzasoleiman 2015)
``disf-greedy``        :class:`~datamask.greedy.GreedyDiSF`, the original DiSF greedy
``topk``               :class:`~datamask.ranking.TopKQuality`
``random``             :class:`~datamask.ranking.RandomSelector`
=====================  =============================================================
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from .greedy import DenseGreedy, GreedyDiSF, LazyGreedy, StochasticGreedy
from .optim import MaskLearner
from .ranking import RandomSelector, TopKQuality

__all__ = ["SELECTORS", "Method", "make_selector"]


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
    >>> from datamask.selectors import make_selector
    >>> type(make_selector("greedy", select_ratio=0.1)).__name__
    'LazyGreedy'
    """
    name = method.value if isinstance(method, Method) else method
    if name not in SELECTORS:
        raise ValueError(f"method must be one of {list(SELECTORS)}; got {method!r}.")
    return SELECTORS[name](**params)
