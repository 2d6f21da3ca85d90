"""datamask: joint quality + diversity selection of pre-training data (DATAMASK)."""

import os as _os

# Idle OpenMP threads sleep instead of spinning (set before torch loads; a value the user
# set wins). Spinning threads on a loaded machine made the sparse greedy 10x slower with
# 2 threads at load average 5.6 on 2 cores (0.45 s -> 4.9 s); see _device.set_threads.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"  # before the submodules: the writer stamps it into every summary

from ._validation import Interval, Options
from .data import Corpus, Selection
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
from .synthetic import make_clustered
from .tables import select_table

__all__ = [
    "ALGORITHMS",
    "Corpus",
    "DiSF",
    "FacilityLocation",
    "Interval",
    "MaskLearner",
    "Objective",
    "Options",
    "PairwiseSimilarity",
    "Quality",
    "Selection",
    "Term",
    "TermContext",
    "ValueTerm",
    "make_clustered",
    "make_term",
    "register_term",
    "select_table",
]
