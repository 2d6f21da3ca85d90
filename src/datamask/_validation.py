"""Input checks in one place. Every message names the argument and what it got."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import Corpus

__all__ = [
    "Interval",
    "Options",
    "describe",
    "satisfies",
    "validate_params",
    "check_ratio",
    "check_choice",
    "check_positive",
    "check_corpus",
    "check_quality_span",
    "check_unique_ids",
    "first_duplicate",
    "unit_rows",
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


def first_duplicate(ids: np.ndarray) -> tuple[int, int] | None:
    """``(first_row, repeat_row)`` of the earliest id that occurs again, or None."""
    ids = np.asarray(ids)
    if len(ids) < 2:
        return None
    try:
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    except TypeError:  # mixed object types: compare their text
        _, first, inverse = np.unique(ids.astype(str), return_index=True, return_inverse=True)
    earlier = first[inverse.reshape(-1)]
    repeats = np.flatnonzero(earlier != np.arange(len(ids)))
    if not len(repeats):
        return None
    row = int(repeats[0])
    return int(earlier[row]), row


def check_unique_ids(ids: np.ndarray, where: str, id_col: str = "id") -> None:
    """Refuse repeated ids, naming the first repeated one and both rows."""
    dup = first_duplicate(ids)
    if dup is not None:
        first, again = dup
        count = len(ids) - len(np.unique(np.asarray(ids).astype(str)))
        raise ValueError(
            f"{id_col} {np.asarray(ids)[again]!r} occurs more than once (rows {first} and "
            f"{again} of {where}; {count} repeated ids in all); ids must be unique."
        )


def check_quality_span(values: np.ndarray, name: str, where: str) -> None:
    """Refuse finite scores whose range overflows float64 (min-max scaling needs max - min)."""
    with np.errstate(over="ignore"):
        span = np.max(values) - np.min(values) if len(values) else 0.0
    if not np.isfinite(span):
        raise ValueError(
            f"{name} spans [{np.min(values):.3g}, {np.max(values):.3g}] in {where}, too wide to "
            "scale (max - min overflows); rescale the scores."
        )


def unit_rows(feats: np.ndarray, where: str, first_row: int = 0, chunk: int = 8192) -> np.ndarray:
    """Rows of ``feats`` scaled to unit L2 norm, as float32 (returned as is when already unit).

    Norms are taken in float64, chunk by chunk: in float32 the norm of a row holding 1e30
    overflows to inf and the row silently becomes zeros. Refuses NaN/inf and all-zero rows.
    """
    norms = np.empty(len(feats), dtype=np.float64)
    for lo in range(0, len(feats), chunk):
        block = np.asarray(feats[lo : lo + chunk], dtype=np.float64)
        norms[lo : lo + chunk] = np.sqrt(np.einsum("ij,ij->i", block, block))
    bad = np.flatnonzero(~np.isfinite(norms))
    if len(bad):
        raise ValueError(
            f"features have {len(bad)} rows with NaN/inf values (first at row "
            f"{first_row + int(bad[0])} of {where}); drop or fix them before selecting."
        )
    zero = np.flatnonzero(norms == 0)
    if len(zero):
        raise ValueError(
            f"features have {len(zero)} all-zero rows (first at row {first_row + int(zero[0])} "
            f"of {where}); a zero embedding has no direction to compare."
        )
    if np.allclose(norms, 1.0, atol=1e-3):
        return np.asarray(feats, dtype=np.float32)
    out = np.empty(feats.shape, dtype=np.float32)
    for lo in range(0, len(feats), chunk):
        block = np.asarray(feats[lo : lo + chunk], dtype=np.float64)
        out[lo : lo + chunk] = block / norms[lo : lo + chunk, None]
    return out


def check_corpus(corpus: Corpus) -> Corpus:
    """Validate shapes, values and ids; L2-normalise features. Returns the corpus."""
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
        check_quality_span(corpus.quality[:, j], name, where)
    count, first = _first_bad(feats)
    if count:
        raise ValueError(
            f"features have {count} rows with NaN/inf values (first at row {first} of {where}); "
            "drop or fix them before selecting."
        )
    check_unique_ids(corpus.ids, where)
    corpus.features = np.require(unit_rows(feats, where), requirements=["C", "W"])
    w = np.asarray(corpus.quality_weights, dtype=np.float64)
    if w.shape != (corpus.quality.shape[1],) or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"quality weights must be non-negative, one per column; got {w}.")
    if w.sum() <= 0:
        raise ValueError(f"quality weights must not all be 0; got {w}.")
    corpus.quality_weights = w / w.sum()
    return corpus


# --- parameter constraint tables (scikit-learn's ``_parameter_constraints``) ----------------
@dataclass(frozen=True)
class Interval:
    """Numbers of ``kind`` (int or float) between ``left`` and ``right`` (None: unbounded).

    ``closed`` is "both", "left", "right" or "neither". ``str()`` is the phrase errors use:

    >>> str(Interval(int, 1, None, closed="left")), str(Interval(float, 0, 1, closed="neither"))
    ('>= 1', 'in (0, 1)')
    """

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, _NUMBER[self.kind]):
            return False
        if not math.isfinite(value):
            return False
        lo_ok = self.left is None or (
            value >= self.left if self.closed in ("both", "left") else value > self.left
        )
        hi_ok = self.right is None or (
            value <= self.right if self.closed in ("both", "right") else value < self.right
        )
        return lo_ok and hi_ok

    def __str__(self) -> str:
        low = self.closed in ("both", "left")
        high = self.closed in ("both", "right")
        if self.right is None:
            return f"{'>=' if low else '>'} {_num(self.left)}"
        if self.left is None:
            return f"{'<=' if high else '<'} {_num(self.right)}"
        left, right = "[" if low else "(", "]" if high else ")"
        return f"in {left}{_num(self.left)}, {_num(self.right)}{right}"


@dataclass(frozen=True)
class Options:
    """One of ``options`` (strings), e.g. ``Options(("expected", "reinforce"))``."""

    options: tuple[str, ...]

    def __contains__(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options

    def __str__(self) -> str:
        return f"one of {list(self.options)}"


_NUMBER: dict[type, tuple[type, ...]] = {
    int: (int, np.integer),
    float: (int, float, np.integer, np.floating),
}


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


#: A constraint list holds types (``bool``, ``str``, ``int``, ``float``), :class:`Interval`,
#: :class:`Options` and ``None`` (the value may be None).
Constraint = type | Interval | Options | None


def satisfies(value: Any, constraint: Constraint) -> bool:
    """Whether ``value`` meets one constraint of a table."""
    if constraint is None:
        return value is None
    if isinstance(constraint, Interval | Options):
        return value in constraint
    if constraint is bool:
        return isinstance(value, bool | np.bool_)
    if constraint in _NUMBER:
        return not isinstance(value, bool) and isinstance(value, _NUMBER[constraint])
    return isinstance(value, constraint)


def describe(constraints: Sequence[Constraint]) -> str:
    """The constraints as an error phrase: ``>= 1``, ``an integer``, ... (None, "use the
    default", is left out: it is never what a user got wrong)."""
    words = {bool: "true or false", str: "a string", int: "an integer", float: "a number"}
    parts = [words.get(c, str(c)) if isinstance(c, type) else str(c) for c in constraints if c]
    return " or ".join(parts)


def validate_params(constraints: Mapping[str, Sequence[Constraint]], values: Mapping) -> None:
    """Check every value of ``values`` named in ``constraints``; the first bad one raises.

    TypeError when the value's type fits no constraint, ValueError when the type fits but
    the value is out of range, worded like every check here: ``{name} must be {what}; got
    {value!r}.``

    >>> validate_params({"n_epochs": [Interval(int, 1, None, closed="left"), None]},
    ...                 {"n_epochs": 0})
    Traceback (most recent call last):
    ...
    ValueError: n_epochs must be >= 1; got 0.
    """
    for name, value in values.items():
        allowed = constraints.get(name)
        if allowed is None or any(satisfies(value, c) for c in allowed):
            continue
        kinds = [c.kind if isinstance(c, Interval) else str if isinstance(c, Options) else c
                 for c in allowed]
        right_type = any(c is not None and satisfies(value, c) for c in kinds if c is not None)
        error = ValueError if right_type else TypeError
        raise error(f"{name} must be {describe(allowed)}; got {value!r}.")
