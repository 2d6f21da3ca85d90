"""Objective terms (one metric per module) and their weighted combination."""

from .base import Term
from .combined import ALGORITHMS, Objective, make_diversity
from .disf import DiSF, correlation_loss
from .facility_location import FacilityLocation
from .pairwise import PairwiseSimilarity
from .quality import Quality

__all__ = [
    "ALGORITHMS",
    "DiSF",
    "FacilityLocation",
    "Objective",
    "PairwiseSimilarity",
    "Quality",
    "Term",
    "correlation_loss",
    "make_diversity",
]
