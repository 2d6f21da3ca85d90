"""The greedy selectors: they pick documents one at a time on the learner's own objective
(registered with the learner in :mod:`datamask.selectors`; the ranking baselines, top-k
quality and random, are in :mod:`datamask.ranking`).

Every selector is a :class:`~datamask.base.Selector`: parameters in ``__init__``,
``fit(corpus)`` sets ``selected_`` (sorted rows, exactly k), ``scores_`` (higher = kept
first), ``terms_`` and ``fit_seconds_``.

The ``--method`` names are listed with their classes in :mod:`datamask.selectors`.
"""

from __future__ import annotations

from .disf import GreedyDiSF
from .lazy import DenseGreedy, LazyGreedy
from .naive import NaiveGreedy
from .stochastic import StochasticGreedy

__all__ = [
    "DenseGreedy",
    "GreedyDiSF",
    "LazyGreedy",
    "NaiveGreedy",
    "StochasticGreedy",
]
