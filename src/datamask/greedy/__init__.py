"""Baseline selectors on the learner's own objective (registered with the learner in
:mod:`datamask.selectors`).

Every selector has the :class:`~datamask.optim.MaskLearner` shape: parameters in
``__init__``, ``fit(corpus)`` sets ``selected_`` (sorted rows, exactly k), ``scores_``
(higher = kept first), ``terms_`` and ``fit_seconds_``.

The ``--method`` names are listed with their classes in :mod:`datamask.selectors`.
"""

from __future__ import annotations

from .disf import GreedyDiSF
from .lazy import DenseGreedy, LazyGreedy
from .naive import NaiveGreedy
from .random import RandomSelector
from .stochastic import StochasticGreedy
from .topk import TopKQuality

__all__ = [
    "DenseGreedy",
    "GreedyDiSF",
    "LazyGreedy",
    "NaiveGreedy",
    "RandomSelector",
    "StochasticGreedy",
    "TopKQuality",
]
