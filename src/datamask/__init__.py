"""datamask: joint quality + diversity selection of pre-training data (DATAMASK)."""

import os as _os

# Idle OpenMP threads sleep instead of spinning (set before torch loads; a value the user
# set wins). Spinning threads on a loaded machine made the sparse greedy 10x slower with
# 2 threads at load average 5.6 on 2 cores (0.45 s -> 4.9 s); see _device.set_threads.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ._validation import Interval, Options
from ._version import __version__
from .api import select, select_table
from .columns import Columns
from .config import SelectSpec
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

__all__ = [
    "ALGORITHMS",
    "Columns",
    "Corpus",
    "DiSF",
    "FacilityLocation",
    "Interval",
    "MaskLearner",
    "Objective",
    "Options",
    "PairwiseSimilarity",
    "Quality",
    "SelectSpec",
    "Selection",
    "Term",
    "TermContext",
    "ValueTerm",
    "__version__",
    "make_clustered",
    "make_term",
    "register_term",
    "select",
    "select_table",
]
