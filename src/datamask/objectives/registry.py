"""Terms by name: the built-in ones and any a user registers (placeholder, see branch terms)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Term
from .disf import DiSF
from .facility_location import FacilityLocation
from .pairwise import PairwiseSimilarity

TERMS: dict[str, type[Term]] = {
    "Facility": FacilityLocation,
    "Pair_simi": PairwiseSimilarity,
    "DiSF": DiSF,
}


def import_term_modules(modules: Sequence[str]) -> None:
    for m in modules:
        importlib.import_module(m)


def term_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    own = getattr(TERMS[name], "_parameter_constraints", {})
    if name == "Facility":
        own = {"n_neighbors", "knn", "n_probe"}
    return {k: v for k, v in params.items() if k in own}


def make_term(name: str, **params: Any) -> Term:
    if name not in TERMS:
        raise ValueError(f"algorithm must be one of {list(TERMS)}; got {name!r}.")
    return TERMS[name](**params)
