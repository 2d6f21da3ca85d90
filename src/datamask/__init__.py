"""datamask: joint quality + diversity selection of pre-training data (DATAMASK).

One door per command, each ``door(input, [selection,] output, spec=None, **settings)``:
:func:`select`, :func:`evaluate`, :func:`apply`, :func:`report`, :func:`bench`,
:func:`embed` (:mod:`datamask.api`). Every selector has one contract (:class:`Selector`:
``fit``, ``transform``, ``fit_transform``).
"""

import os as _os

# Idle OpenMP threads sleep instead of spinning (set before torch loads; a value the user
# set wins). Spinning threads on a loaded machine made the sparse greedy 10x slower with
# 2 threads at load average 5.6 on 2 cores (0.45 s -> 4.9 s); see _device.set_threads.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ._validation import Interval, Options, check_corpus
from ._version import __version__
from .api import select, select_table
from .applying import ApplySpec
from .base import Selector
from .columns import Columns
from .config import SelectSpec
from .data import Corpus, Selection
from .doors import apply, bench, embed, evaluate, report
from .embedding import EmbedSpec
from .evaluation import BenchSpec, EvaluateSpec, ReportSpec
from .greedy import DenseGreedy, GreedyDiSF, LazyGreedy, StochasticGreedy
from .io.parquet import read_corpus
from .objectives import (
    ALGORITHMS,
    DiSF,
    FacilityLocation,
    Objective,
    PairwiseSimilarity,
    Quality,
    Term,
    TermContext,
    ValueTerm,
    make_term,
    register_term,
)
from .optim import MaskLearner
from .ranking import RandomSelector, TopKQuality
from .selectors import SELECTORS
from .settings import Spec
from .synthetic import make_clustered

__all__ = [
    "ALGORITHMS",
    "SELECTORS",
    "ApplySpec",
    "BenchSpec",
    "Columns",
    "Corpus",
    "DenseGreedy",
    "DiSF",
    "EmbedSpec",
    "EvaluateSpec",
    "FacilityLocation",
    "GreedyDiSF",
    "Interval",
    "LazyGreedy",
    "MaskLearner",
    "Objective",
    "Options",
    "PairwiseSimilarity",
    "Quality",
    "RandomSelector",
    "ReportSpec",
    "SelectSpec",
    "Selection",
    "Selector",
    "Spec",
    "StochasticGreedy",
    "Term",
    "TermContext",
    "TopKQuality",
    "ValueTerm",
    "__version__",
    "apply",
    "bench",
    "check_corpus",
    "embed",
    "evaluate",
    "make_clustered",
    "make_term",
    "read_corpus",
    "register_term",
    "report",
    "select",
    "select_table",
]
