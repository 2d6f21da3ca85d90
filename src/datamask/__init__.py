"""datamask: joint quality + diversity selection of pre-training data (DATAMASK)."""

from .data import Corpus, Selection
from .objectives import (
    ALGORITHMS,
    DiSF,
    FacilityLocation,
    Objective,
    PairwiseSimilarity,
    Quality,
    Term,
    make_diversity,
)
from .optim import MaskLearner
from .synthetic import make_clustered

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "Corpus",
    "DiSF",
    "FacilityLocation",
    "MaskLearner",
    "Objective",
    "PairwiseSimilarity",
    "Quality",
    "Selection",
    "Term",
    "make_clustered",
    "make_diversity",
]
