"""One frozen :class:`BenchSpec`: everything ``datamask bench`` (and
:func:`datamask.evaluation.bench.bench`) runs with, declared once and checked once, where the
command line and the library meet.

Each setting is a field declared with :func:`~datamask._validation.setting_field` (its
default, what it accepts, its help), or the field of ``select``'s spec it shares
(:func:`~datamask.settings.shared_field`: ``select_ratio``, the token budget's
``budget_tokens`` and ``select_token_ratio``, ``seed``, ``device``, ``threads``);
``datamask bench``'s flags are made from these declarations. A spec that
exists is checked: ``__post_init__`` checks every field, the methods and each method's
parameters (the per-method :class:`~datamask.config.SelectSpec` is built and checked there,
once, and is what each run fits).

    >>> spec = BenchSpec.from_mapping({"methods": ["topk", "greedy"], "lamb": 0.2, "eps": 0.5})
    >>> spec.methods, spec.objective.lamb, spec.method_params
    (('topk', 'greedy'), 0.2, ())
    >>> BenchSpec(map_points=0)
    Traceback (most recent call last):
    ...
    ValueError: map_points must be >= 1; got 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .._validation import Interval, Options
from ..columns import Columns
from ..config import (
    ObjectiveSpec,
    PartitionSpec,
    SelectorSpec,
    SelectSpec,
    selector_settings,
)
from ..data import Corpus
from ..io.input_settings import InputSettings
from ..objectives.registry import import_term_modules
from ..selectors import SELECTORS
from ..settings import (
    Spec,
    as_names,
    check_fields,
    fold_columns,
    ignored_fields,
    section_settings,
    setting_field,
    shared_field,
)
from ..synthetic import make_clustered
from .redundancy import DuplicateSettings, check_thresholds

__all__ = [
    "DEFAULT_METHODS",
    "BenchSpec",
    "SyntheticSpec",
    "method_spec",
    "parse_method_param",
]

DEFAULT_METHODS = ("mask", "greedy", "stochastic-greedy", "topk", "random")
#: The budget settings a bench takes, one at a time (``select_ratio`` is the default).
_BUDGETS = ("select_ratio", "budget_tokens", "select_token_ratio")

#: The keys :meth:`BenchSpec.from_mapping` takes besides the fields: a method's parameters
#: for one method (``param``, ``METHOD.KEY=VALUE`` items) or for disf-greedy alone.
_METHOD_KEYS = ("param", "disf_batch_size")


def _method_names() -> tuple:
    return (Options(str, tuple(SELECTORS)),)


_COUNT = Interval(int, 1, None, closed="left")


def _drawn(spec: Any, sharded: bool) -> str | None:
    """The map's settings are read only where the PNGs are drawn."""
    if not spec.plots:
        return "--no-plots draws no map"
    return None if spec.out_dir is not None else "no out_dir: nothing is drawn"


def _synthetic_only(spec: Any, sharded: bool) -> str | None:
    return None if spec.synthetic is not None else "it shapes --synthetic data, not --input"


@dataclass(frozen=True)
class BenchSpec(Spec):
    """Everything a bench runs with. Build it with :meth:`from_mapping` (flat keys, as the
    flags and :func:`~datamask.evaluation.bench.bench`'s keywords give them) or directly.

    ``objective`` is what every method is run and scored with; ``method_params`` the extra
    constructor arguments per method (a mapping ``{method: {key: value}}`` is accepted and
    held as nested pairs, in order).
    """

    methods: tuple[str, ...] = setting_field(
        DEFAULT_METHODS, _method_names, "methods to run, in order", many=True
    )
    objective: ObjectiveSpec = ObjectiveSpec()
    select_ratio: float = shared_field(SelectorSpec, "select_ratio")
    budget_tokens: float | None = shared_field(SelectorSpec, "budget_tokens")
    select_token_ratio: float | None = shared_field(SelectorSpec, "select_token_ratio")
    seed: int = shared_field(SelectorSpec, "seed")
    device: str = shared_field(SelectorSpec, "device")
    method_params: Mapping[str, Mapping[str, Any]] | tuple = ()
    isolate: bool = setting_field(
        True,
        (bool,),
        "run every method in a fresh process (clean memory numbers); --no-isolate: all in "
        "this process (faster start; memory then includes allocator reuse)",
    )
    out_dir: str | None = setting_field(
        None,
        (str, os.PathLike, None),
        "folder for bench.md, bench.json and (unless --no-plots) the PNGs; required on the "
        "command line (bench(): None writes nothing)",
    )
    plots: bool = setting_field(
        True, (bool,), "draw the PNGs (needs matplotlib; --no-plots: skip them)"
    )
    map_method: str = setting_field(
        "pca", (Options(str, ("pca", "tsne")),), "projection of the 2-D map", needs=_drawn
    )
    map_points: int = setting_field(3000, (_COUNT,), "documents drawn on the map", needs=_drawn)
    title: str | None = setting_field(None, (str, None), "markdown heading")
    dup_thresholds: tuple[float, ...] = shared_field(DuplicateSettings, "dup_thresholds")
    dup_search: str = shared_field(DuplicateSettings, "dup_search")
    #: How a path given to :func:`datamask.bench` is read (a Corpus is taken as it is).
    columns: Columns = Columns()
    split: str | None = shared_field(InputSettings, "split")
    length_col: str | None = shared_field(InputSettings, "length_col")

    def __post_init__(self) -> None:
        super().__post_init__()
        set_ = object.__setattr__  # frozen: the checked values, normalised, once
        set_(self, "dup_thresholds", check_thresholds(self.dup_thresholds))
        if self.out_dir is not None:
            set_(self, "out_dir", os.fspath(self.out_dir))
        if not isinstance(self.objective, ObjectiveSpec):
            raise TypeError(f"objective must be an ObjectiveSpec; got {self.objective!r}.")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods lists a method twice: {list(self.methods)}.")
        set_(self, "method_params", _held(self.method_params))
        unknown = sorted(set(dict(self.method_params)) - set(self.methods))
        if unknown:
            raise ValueError(f"method_params names methods not being run: {unknown}.")
        set_(self, "_select_specs", {m: self._select_spec(m) for m in self.methods})

    def ignored(self) -> dict[str, str]:
        """The settings given another value than their default that this bench does not
        read (the map's without plots or without out_dir), each with why. They are warned
        about at the door and listed under ``ignored_settings``."""
        return ignored_fields(self, self)

    # --- what the runs are ------------------------------------------------------------
    def params_of(self, method: str) -> dict[str, Any]:
        """The extra constructor arguments of ``method``'s run (none: ``{}``)."""
        return {k: dict(v) for k, v in self.method_params}.get(method, {})

    @property
    def token_budget(self) -> bool:
        """Whether the runs keep a token budget (``budget_tokens`` or ``select_token_ratio``)."""
        return self.budget_tokens is not None or self.select_token_ratio is not None

    @property
    def common(self) -> dict[str, Any]:
        """The settings every run shares: the budget (``select_ratio``, or the token
        budget when one is set), ``seed``, ``device``."""
        tokens = {
            "budget_tokens": self.budget_tokens,
            "select_token_ratio": self.select_token_ratio,
        }
        budget = {k: v for k, v in tokens.items() if v is not None} or {
            "select_ratio": self.select_ratio
        }
        return {**budget, "seed": self.seed, "device": self.device}

    def to_mapping(self) -> dict[str, Any]:
        """As :meth:`Spec.to_mapping`, without ``select_ratio`` (its default) under a token
        budget: the flat keys give one budget."""
        out = super().to_mapping()
        if self.token_budget:
            del out["select_ratio"]
        return out

    def select_spec(self, method: str) -> SelectSpec:
        """``method``'s run as ``select`` would run it: checked when this spec was made."""
        return self.__dict__["_select_specs"][method]

    def _select_spec(self, method: str) -> SelectSpec:
        return method_spec(self.objective, method, {**self.common, **self.params_of(method)})

    # --- from flat keys ---------------------------------------------------------------
    @classmethod
    def flat_keys(cls) -> list[str]:
        """Every flat key :meth:`from_mapping` takes (the CLI passes these of its flags)."""
        own = [f.name for f in fields(cls)]
        objective = sorted(ObjectiveSpec.flat_keys())
        return [*own, *objective, *(o.name for o in selector_settings()), *_METHOD_KEYS]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> BenchSpec:
        """A spec from flat keys; None means "the default".

        Besides the fields: the objective's keys (``algorithm``, ``lamb``, ``term_modules``
        and every term's parameters, instead of ``objective``); any method's parameter by
        its name (``n_epochs``, ``eps``, ...: to every method run that takes it);
        ``param``, ``METHOD.KEY=VALUE`` items for one method; ``disf_batch_size``,
        disf-greedy's batch size alone. Unknown keys raise a ValueError naming them.
        """
        values = fold_columns(cls, values)  # id_col, quality_col, ... -> columns
        import_term_modules(as_names(values.get("term_modules", ())))
        unknown = sorted(set(values) - set(cls.flat_keys()))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown} in {where}; known: {cls.flat_keys()}.")
        own = {f.name for f in fields(cls)}
        rest = {k: v for k, v in values.items() if k not in own}
        objective = ObjectiveSpec.given_or_flat(values, rest, where)
        kept = {k: v for k, v in values.items() if k in own and k != "method_params"}
        budgets = [k for k in _BUDGETS if kept.get(k) is not None]
        if len(budgets) > 1:
            got = ", ".join(f"{k}={kept[k]}" for k in budgets)
            raise ValueError(f"give the budget one way: {', '.join(_BUDGETS)}; got {got}.")
        if kept.get("methods") is None:
            kept["methods"] = DEFAULT_METHODS
        methods = tuple(as_names(kept["methods"]))  # a bad value: refused by the field's check
        params = _method_params(methods, values)
        return cls(**{**kept, "objective": objective, "method_params": params})


def method_spec(objective: ObjectiveSpec, method: str, params: dict[str, Any]) -> SelectSpec:
    """One bench run's spec: ``method`` with ``params`` (shared settings such as ``seed`` and
    its own), scored with ``objective``; checked as ``select`` checks its spec."""
    shared = {f.name for f in fields(SelectorSpec)} - {"method", "params"}
    selector = SelectorSpec(
        method=method,
        params=tuple(sorted((k, v) for k, v in params.items() if k not in shared)),
        **{k: v for k, v in params.items() if k in shared},
    )
    one_group = PartitionSpec(budget="group")  # the whole corpus is the group: no merge round
    return SelectSpec(objective=objective, selector=selector, partition=one_group).check()


def _held(params: Any) -> tuple:
    """``{method: {key: value}}`` (or its pairs) as nested pairs, in their order."""
    items = params.items() if isinstance(params, Mapping) else params
    out = []
    for method, own in items:
        if method not in SELECTORS:
            raise ValueError(
                f"method_params: method must be one of {list(SELECTORS)}; got {method!r}."
            )
        pairs = own.items() if isinstance(own, Mapping) else own
        out.append((method, tuple((str(k), v) for k, v in pairs)))
    return tuple(out)


def _method_params(methods: tuple, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method run, its parameters: ``method_params`` as given, then each method
    parameter key (to every method being run that takes it), then ``disf_batch_size``, then
    the ``param`` items, each overriding the one before."""
    given = dict(_held(values.get("method_params", ())))
    params: dict[str, dict[str, Any]] = {m: dict(p) for m, p in given.items()}
    found: dict[str, dict[str, Any]] = {}
    for opt in selector_settings():
        if opt.name in values:
            for method in opt.owners:
                found.setdefault(method, {})[opt.name] = values[opt.name]
    if "disf_batch_size" in values:
        found.setdefault("disf-greedy", {})["batch_size"] = values["disf_batch_size"]
    for item in as_names(values.get("param", ())):
        method, name, value = parse_method_param(item)
        found.setdefault(method, {})[name] = value
    for method, own in found.items():
        if method in methods:  # a flag for a method not being run is not used
            params.setdefault(method, {}).update(own)
    return params


def parse_method_param(item: str) -> tuple[str, str, Any]:
    """``METHOD.KEY=VALUE`` -> (method, key, value), the value typed and checked by the
    key's option (``none`` -> None).

    >>> parse_method_param("mask.partial=0.2")
    ('mask', 'partial', 0.2)
    """
    key, sep, text = item.partition("=")
    method, dot, name = key.rpartition(".")
    name = name.replace("-", "_")
    if not sep or not dot or not name:
        raise ValueError(f"--param takes METHOD.KEY=VALUE (e.g. mask.partial=0.2); got {item!r}.")
    if method not in SELECTORS:
        raise ValueError(f"--param method must be one of {list(SELECTORS)}; got {method!r}.")
    own = {o.name: o for o in selector_settings() if method in o.owners}
    opt = own.get(name) or {o.name: o for o in section_settings(SelectorSpec)}.get(name)
    if opt is None:
        raise ValueError(
            f"--param {item!r}: {name} is not a parameter of method {method!r} (it takes "
            f"{sorted(own) + ['max_similarity']})."
        )
    return method, name, opt.check(_typed(text, opt.kind))


def _typed(text: str, kind: type) -> Any:
    """``text`` as ``kind`` (``none`` -> None), as a flag would parse it."""
    if text.lower() in ("none", "null"):
        return None
    if kind is bool:
        return text.lower() in ("1", "true", "yes")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--param value {text!r} is not {kind.__name__}.") from None


@dataclass(frozen=True)
class SyntheticSpec:
    """``datamask bench --synthetic N``: clustered data made by
    :func:`datamask.make_clustered` instead of a file."""

    synthetic: int | None = setting_field(
        None,
        (Interval(int, 2, None, closed="left"), None),
        "generate N clustered documents (datamask.make_clustered) instead",
    )
    dim: int = setting_field(384, (_COUNT,), "--synthetic width", needs=_synthetic_only)
    clusters: int = setting_field(50, (_COUNT,), "--synthetic cluster count", needs=_synthetic_only)
    data_seed: int = setting_field(
        0,
        (Interval(int, 0, None, closed="left"),),
        "--synthetic generator seed",
        needs=_synthetic_only,
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def ignored(self) -> dict[str, str]:
        """The data settings given that a bench of a file (no ``synthetic``) does not read."""
        return ignored_fields(self, self)

    def make(self) -> Corpus:
        if self.synthetic is None:
            raise ValueError("synthetic must be a number of documents >= 2; got None.")
        corpus = make_clustered(self.synthetic, self.dim, self.clusters, seed=self.data_seed)
        corpus.source = (
            f"make_clustered({self.synthetic}, {self.dim}, {self.clusters}, seed={self.data_seed})"
        )
        return corpus
