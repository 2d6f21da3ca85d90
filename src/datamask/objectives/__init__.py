"""Objective terms (one metric per module), their registry and weighted combination."""

from .base import Term, TermContext
from .combined import ALGORITHMS, Objective
from .disf import DiSF, correlation_loss, offdiag_correlation
from .facility_location import FacilityLocation
from .pairwise import PairwiseSimilarity
from .quality import Quality
from .registry import (
    TERMS,
    import_term_modules,
    make_term,
    qualified_name,
    register_term,
    term_names,
    term_params,
)
from .value_only import ValueTerm

__all__ = [
    "ALGORITHMS",
    "DiSF",
    "FacilityLocation",
    "Objective",
    "PairwiseSimilarity",
    "Quality",
    "TERMS",
    "Term",
    "TermContext",
    "ValueTerm",
    "correlation_loss",
    "import_term_modules",
    "make_term",
    "offdiag_correlation",
    "qualified_name",
    "register_term",
    "term_names",
    "term_params",
]
