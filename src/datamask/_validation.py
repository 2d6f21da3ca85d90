"""Input checks in one place. Every message names the argument and what it got."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .data import Corpus

__all__ = [
    "setting_field",
    "Interval",
    "Options",
    "SEED",
    "describe",
    "describe_constraint",
    "satisfies",
    "validate_params",
    "check_ratio",
    "check_choice",
    "check_positive",
    "check_count",
    "COUNT",
    "check_corpus",
    "check_finite_quality",
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


#: The fraction ``select`` keeps when none is given (the reference's ratio).
DEFAULT_SELECT_RATIO = 0.3


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


def check_finite_quality(quality: np.ndarray, names: Sequence[str], where: str) -> None:
    """Refuse NaN/inf (and null) quality scores, naming the column, the first bad row and
    ``where``."""
    for j, name in enumerate(names):
        count, first = _first_bad(quality[:, j])
        if count:
            raise ValueError(
                f"{name} has {count} null, NaN or inf values (first at row {first} of "
                f"{where}); drop or fill them before selecting."
            )


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
        ids = np.asarray(ids)
        count = len(ids) - len(np.unique(ids.astype(str)))
        value = ids[again : again + 1].tolist()[0]  # a Python value: 'b', not np.str_('b')
        raise ValueError(
            f"{id_col} {value!r} occurs more than once (rows {first} and "
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
    """Validate shapes, values and ids. Returns the checked corpus: a new :class:`Corpus`
    with L2-normalised features and quality weights summing to 1; ``corpus`` itself is
    never changed (use the return value)."""
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
        check_finite_quality(corpus.quality[:, j : j + 1], [name], where)
        check_quality_span(corpus.quality[:, j], name, where)
    check_unique_ids(corpus.ids, where, corpus.id_name)
    # NaN/inf and all-zero rows are refused by the norms taken there (no pass of its own)
    features = np.require(unit_rows(feats, where), requirements=["C", "W"])
    w = np.asarray(corpus.quality_weights, dtype=np.float64)
    if w.shape != (corpus.quality.shape[1],) or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"quality weights must be non-negative, one per column; got {w}.")
    if w.sum() <= 0:
        raise ValueError(f"quality weights must not all be 0; got {w}.")
    return replace(corpus, features=features, quality_weights=w / w.sum())


# --- parameter constraint tables (scikit-learn's ``_parameter_constraints``) ------------------
@dataclass(frozen=True)
class Interval:
    """Numbers of ``type`` (``int`` or ``float``) between ``left`` and ``right``.

    ``None`` for a bound means unbounded; ``closed`` says which bounds belong to the range:
    ``"both"``, ``"left"``, ``"right"`` or ``"neither"``. An ``Interval(float, ...)``
    accepts ints too; booleans are never numbers here. ``str()`` is the phrase errors use.

    Examples
    --------
    >>> Interval(int, 1, None, closed="left").is_satisfied_by(3)
    True
    >>> str(Interval(int, 1, None, closed="left")), str(Interval(float, 0, 1, closed="right"))
    ('>= 1', 'in (0, 1]')
    """

    type: type
    left: float | None
    right: float | None
    closed: str = "both"

    def __post_init__(self) -> None:
        if self.type not in (int, float):
            raise TypeError(f"Interval type must be int or float; got {self.type!r}.")
        if self.closed not in ("both", "left", "right", "neither"):
            raise ValueError(
                f"closed must be one of ['both', 'left', 'right', 'neither']; got {self.closed!r}."
            )

    def is_satisfied_by(self, value: Any) -> bool:
        if not _is_type(value, self.type):
            return False
        if not math.isfinite(value):
            return False
        left_in = self.closed in ("both", "left")
        right_in = self.closed in ("both", "right")
        if self.left is not None and (value < self.left or (value == self.left and not left_in)):
            return False
        return self.right is None or value < self.right or (value == self.right and right_in)

    def __str__(self) -> str:
        low = self.closed in ("both", "left")
        high = self.closed in ("both", "right")
        if self.right is None and self.left is not None:
            return f"{'>=' if low else '>'} {_num(self.left)}"
        if self.left is None and self.right is not None:
            return f"{'<=' if high else '<'} {_num(self.right)}"
        if self.left is None:
            return "a number" if self.type is float else "an integer"
        left, right = "[" if low else "(", "]" if high else ")"
        return f"in {left}{_num(self.left)}, {_num(self.right)}{right}"


#: What a ``seed`` accepts, everywhere one is taken (``select``, every selector, ``report``).
SEED = Interval(int, 0, 2**63 - 1, closed="both")


@dataclass(frozen=True)
class Options:
    """One of a closed set of values of ``type``, e.g. ``Options(str, ("a", "b"))`` (a tuple
    keeps its order in messages and ``--help``; a set is shown sorted)."""

    type: type
    options: frozenset | tuple

    def is_satisfied_by(self, value: Any) -> bool:
        return isinstance(value, self.type) and value in self.options

    @property
    def ordered(self) -> list:
        return list(self.options) if isinstance(self.options, tuple) else sorted(self.options)

    def __str__(self) -> str:
        return f"one of {self.ordered}"


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _is_type(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool | np.bool_)
    if isinstance(value, bool | np.bool_):
        return False
    if kind is int:
        return isinstance(value, int | np.integer)
    if kind is float:
        return isinstance(value, int | float | np.integer | np.floating)
    return isinstance(value, kind)


def satisfies(value: Any, constraint: Any) -> bool:
    """Whether ``value`` meets one constraint of a table: a type, ``None``, an
    :class:`Interval`, an :class:`Options` or a predicate (a callable returning bool)."""
    if constraint is None:
        return value is None
    if isinstance(constraint, Interval | Options):
        return constraint.is_satisfied_by(value)
    if isinstance(constraint, type):
        return _is_type(value, constraint)
    if callable(constraint):  # a predicate with a ``description`` attribute, or its name
        return bool(constraint(value))
    raise TypeError(f"unknown parameter constraint {constraint!r}.")


def describe_constraint(constraint: Any) -> str:
    """One constraint in words: ``>= 1``, ``one of ['a', 'b']``, ``an integer``, ..."""
    if constraint is None:
        return "None"
    if isinstance(constraint, type):
        words = {bool: "true or false", str: "a string", int: "an integer", float: "a number"}
        return words.get(constraint, f"an instance of {constraint.__name__}")
    if isinstance(constraint, Interval | Options):
        return str(constraint)
    return getattr(constraint, "description", getattr(constraint, "__name__", repr(constraint)))


def describe(constraints: Sequence[Any]) -> str:
    """A constraint list as an error phrase. None ("use the default") is left out: it is
    never what a user got wrong."""
    return " or ".join(describe_constraint(c) for c in constraints if c is not None)


def _kind(constraint: Any) -> type | None:
    if isinstance(constraint, Interval | Options):
        return constraint.type
    return constraint if isinstance(constraint, type) else None


def validate_params(owner: str, constraints: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Check every value against its constraint list (scikit-learn's model).

    Parameters
    ----------
    owner : str
        What the parameters belong to (a class name, or "settings"), named when a
        parameter is not declared.
    constraints : mapping of str to list
        Per parameter, the accepted forms: a type (``int``, ``float``, ``str``, ``bool`` or
        any class), ``None``, an :class:`Interval`, an :class:`Options`, or a predicate
        (a callable returning bool; its ``description`` attribute names it). A value is
        valid when it satisfies at least one. ``"no_validation"`` skips the parameter.
    values : mapping of str to object
        The parameters to check (only those present are checked).

    Raises
    ------
    TypeError
        A name ``constraints`` does not declare, or a value of a type no constraint takes.
    ValueError
        A value of the right type outside every constraint. Both are worded like every
        check at the door: ``{name} must be {what}; got {value!r}.``

    Examples
    --------
    >>> validate_params("F", {"k": [Interval(int, 1, None, closed="left"), None]}, {"k": 0})
    Traceback (most recent call last):
    ...
    ValueError: k must be >= 1; got 0.
    """
    unknown = sorted(set(values) - set(constraints))
    if unknown:
        raise TypeError(
            f"{owner} got unexpected parameter(s) {unknown}; it takes {sorted(constraints)}."
        )
    for name, value in values.items():
        allowed = constraints[name]
        if allowed == "no_validation" or any(satisfies(value, c) for c in allowed):
            continue
        kinds = [k for k in map(_kind, allowed) if k is not None]
        predicate = any(callable(c) and not isinstance(c, type) for c in allowed)
        error = ValueError if predicate or any(_is_type(value, k) for k in kinds) else TypeError
        raise error(f"{name} must be {describe(allowed)}; got {value!r}.")


#: A count: an integer >= 1 (what a count's check says: ``n_probe must be >= 1; got 0.``).
COUNT = Interval(int, 1, None, closed="left")


def check_count(name: str, value: Any) -> int:
    """``value`` checked to be an integer >= 1 (a TypeError for a non-integer, else a
    ValueError), as a declared count is checked; returned as an int. The one check of a
    count outside a declaration (a function's argument)."""
    validate_params("settings", {name: [COUNT]}, {name: value})
    return int(value)


def setting_field(
    default: Any,
    constraints: tuple | Callable[[], tuple],
    help: str,
    *,
    needs: Callable[[Any, bool], str | None] | None = None,
    **kw: Any,
) -> Any:
    """A dataclass field declared as a setting: its default, what it accepts (the
    constraints :func:`validate_params` checks; a callable returning them is resolved when
    checked) and the help of its flag and config key. Read back as a
    :class:`datamask.settings.Setting` by :func:`datamask.settings.section_settings`.

    ``needs``, for a setting only some runs read: ``needs(spec, sharded)`` says why the run
    ``spec`` describes ignores it (None: the run reads it). A setting a run ignores is
    warned about and not recorded as used (``SelectSpec.ignored``)."""
    meta: dict[str, Any] = {"setting": (constraints, help, kw)}
    if needs is not None:
        meta["needs"] = needs
    return field(default=default, metadata=meta)
