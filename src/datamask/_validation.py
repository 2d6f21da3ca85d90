"""Input checks in one place. Every message names the argument and what it got."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .data import Corpus

__all__ = [
    "check_ratio",
    "check_choice",
    "check_positive",
    "check_corpus",
    "k_from_ratio",
    "resolve_k",
]


def check_ratio(name: str, value: float, *, low_open: bool = True, high_open: bool = True) -> float:
    """Check ``value`` lies in (0, 1) (bounds open or closed as asked)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number; got {value!r}.") from None
    lo_ok = v > 0 if low_open else v >= 0
    hi_ok = v < 1 if high_open else v <= 1
    if not (math.isfinite(v) and lo_ok and hi_ok):
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name} must be in {lo}0, 1{hi}; got {value}.")
    return v


def check_positive(
    name: str, value: Any, *, integer: bool = False, allow_zero: bool = False
) -> Any:
    """Check a positive number (or int when ``integer``)."""
    if integer and (isinstance(value, bool) or not isinstance(value, int | np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r}.")
    numeric = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool
    )
    if not numeric:
        raise TypeError(f"{name} must be a number; got {value!r}.")
    ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {value!r}.")
    return value


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """Check ``value`` is one of ``choices`` (case-sensitive), suggesting the list."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}.")
    return value


def k_from_ratio(select_ratio: float, n_docs: int) -> int:
    """``round(select_ratio * n_docs)``, refusing a selection of nothing."""
    k = int(round(select_ratio * n_docs))
    if k < 1:
        raise ValueError(
            f"k=0: select_ratio {select_ratio} of {n_docs} documents selects nothing; "
            "raise select_ratio."
        )
    return k


def resolve_k(select_ratio: float, n_docs: int, k: int | None = None) -> int:
    """The subset size: ``k`` when given (1 <= k <= n_docs), else from ``select_ratio``."""
    if k is None:
        return k_from_ratio(select_ratio, n_docs)
    check_positive("k", k, integer=True)
    if k > n_docs:
        raise ValueError(f"k={k} exceeds the {n_docs} documents given.")
    return int(k)


def _first_bad(values: np.ndarray) -> tuple[int, int]:
    bad = ~np.isfinite(values)
    if bad.ndim > 1:
        bad = bad.any(axis=tuple(range(1, bad.ndim)))
    rows = np.flatnonzero(bad)
    return len(rows), (int(rows[0]) if len(rows) else -1)


def check_corpus(corpus: Corpus) -> Corpus:
    """Validate shapes and values; L2-normalise features in place. Returns the corpus."""
    where = corpus.source
    n = len(corpus.ids)
    if n == 0:
        raise ValueError(f"{where} has no rows.")
    feats = np.asarray(corpus.features)
    if feats.ndim != 2 or feats.shape[0] != n:
        raise ValueError(
            f"features must have shape (n_docs, dim) = ({n}, d); got {feats.shape} in {where}."
        )
    if feats.shape[1] == 0:
        raise ValueError(f"features in {where} have width 0.")
    if corpus.quality.shape[0] != n:
        raise ValueError(f"quality has {corpus.quality.shape[0]} rows but there are {n} ids.")
    for j, name in enumerate(corpus.quality_names):
        count, first = _first_bad(corpus.quality[:, j])
        if count:
            raise ValueError(
                f"{name} has {count} NaN/inf values (first at row {first} of {where}); "
                "drop or fill them before selecting."
            )
    count, first = _first_bad(feats)
    if count:
        raise ValueError(
            f"features have {count} rows with NaN/inf values (first at row {first} of {where}); "
            "drop or fix them before selecting."
        )
    feats = feats.astype(np.float32, copy=False)
    norms = np.linalg.norm(feats, axis=1)
    zero = np.flatnonzero(norms == 0)
    if len(zero):
        raise ValueError(
            f"features have {len(zero)} all-zero rows (first at row {zero[0]} of {where}); "
            "a zero embedding has no direction to compare."
        )
    if not np.allclose(norms, 1.0, atol=1e-3):
        feats = feats / norms[:, None]
    corpus.features = np.require(feats, requirements=["C", "W"])  # torch wants writable
    w = np.asarray(corpus.quality_weights, dtype=np.float64)
    if w.shape != (corpus.quality.shape[1],) or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"quality weights must be non-negative, one per column; got {w}.")
    if w.sum() <= 0:
        raise ValueError(f"quality weights must not all be 0; got {w}.")
    corpus.quality_weights = w / w.sum()
    return corpus
