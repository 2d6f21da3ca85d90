"""One configuration: the frozen spec every entry point builds, checks once and passes on.

A :class:`SelectSpec` is five frozen sections: what is maximised (:class:`ObjectiveSpec`),
by which method (:class:`SelectorSpec`), on which columns (:class:`ColumnsSpec`), how a
corpus is split (:class:`PartitionSpec`) and how the run is carried out (:class:`RunSpec`).
Each setting is declared once, as an :class:`Option` here or in the constraint table of the
selector or term that owns it (``_parameter_constraints``, scikit-learn's model); the
command line's flags, choices and help, the keys of a YAML/TOML ``--config`` file and the
checks are all made from those declarations. The spec is what :func:`datamask.pipeline.select`
runs, what is fingerprinted for resume, and what crosses process boundaries (it pickles).

    >>> spec = SelectSpec.from_mapping({"select_ratio": 0.1, "n_epochs": 50})
    >>> spec.selector.select_ratio, dict(spec.selector.params)["n_epochs"]
    (0.1, 50)
    >>> spec.flat()["algorithm"]
    ('Facility',)
"""

from __future__ import annotations

import inspect
import re
import tomllib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from ._device import check_device_name
from ._validation import DEFAULT_SELECT_RATIO, Interval, Options, validate_params
from .objectives import Objective
from .objectives.combined import DEFAULT_ALGORITHM, DEFAULT_LAMB, resolve_objective
from .objectives.registry import TERMS, import_term_modules
from .selectors import SELECTORS

__all__ = [
    "ColumnsSpec",
    "ObjectiveSpec",
    "Option",
    "PartitionSpec",
    "RunSpec",
    "SelectSpec",
    "SelectorSpec",
    "check_settings",
    "iter_options",
    "load_config",
    "quality_spec",
    "split_quality",
    "options",
    "selector_options",
    "term_options",
]


# --- one setting ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One setting: its key, default, what it accepts and its help.

    Attributes
    ----------
    name : str
        Config key and ``--flag`` (``select_ratio`` -> ``--select-ratio``, ``--select_ratio``).
    default : object
        Its value when nobody sets it.
    constraints : tuple
        What it accepts (see :func:`datamask._validation.validate_params`); a callable
        returning them is resolved when checked (choices that come from a registry).
    help : str
        One sentence for ``--help``.
    many : bool
        A list of values (``nargs="+"``), held as a tuple.
    owners : tuple of str
        For selector and term parameters: the methods or terms that take it.
    """

    name: str
    default: Any
    constraints: tuple | Callable[[], tuple]
    help: str
    many: bool = False
    owners: tuple[str, ...] = ()

    def allowed(self) -> tuple:
        return self.constraints() if callable(self.constraints) else self.constraints

    def check(self, value: Any) -> Any:
        """``value`` checked (a list becomes a tuple for ``many``). Returns it."""
        if self.many:
            items = (value,) if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not items:
                raise TypeError(f"{self.name} must be a name or a list of names; got {value!r}.")
            for item in items:
                validate_params("settings", {self.name: self.allowed()}, {self.name: item})
            return tuple(items)
        if isinstance(value, int) and not isinstance(value, bool) and self.kind is float:
            value = float(value)
        validate_params("settings", {self.name: self.allowed()}, {self.name: value})
        return value

    @property
    def kind(self) -> type:
        """The Python type of one value (what argparse converts a flag's text to)."""
        for c in self.allowed():
            if isinstance(c, Interval | Options):
                return c.type
            if isinstance(c, type):
                return c
        return str

    @property
    def choices(self) -> list[str] | None:
        for c in self.allowed():
            if isinstance(c, Options):
                return c.ordered
        return None


def _option(default: Any, constraints: tuple | Callable[[], tuple], help: str, **kw: Any) -> Any:
    """A spec field declared with its :class:`Option` (read back by :func:`options`)."""
    return field(default=default, metadata={"option": (constraints, help, kw)})


_RATIO = Interval(float, 0, 1, closed="neither")


def _device_name(value: Any) -> bool:
    """A device name a worker can resolve (checked here without touching CUDA)."""
    try:
        check_device_name(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


_device_name.description = "'auto', 'cpu', 'cuda' or 'cuda:N'"  # type: ignore[attr-defined]
_COUNT = Interval(int, 0, None, closed="neither")  # "> 0", as every count's message says


def _method_names() -> tuple:
    return (Options(str, tuple(SELECTORS)),)


def _term_names() -> tuple:
    return (Options(str, tuple(TERMS)),)


# --- the five sections ------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveSpec:
    """``J = lamb * quality + (1 - lamb) * mean of the diversity terms``."""

    algorithm: tuple[str, ...] = _option(
        (DEFAULT_ALGORITHM,),
        _term_names,
        "diversity term(s), equally weighted: a registered term name (built in: Facility, "
        "Pair_simi, DiSF; --term-module adds yours)",
        many=True,
    )
    lamb: float = _option(
        DEFAULT_LAMB, (Interval(float, 0, 1, closed="both"),), "weight of quality in [0, 1]"
    )
    term_modules: tuple[str, ...] = _option(
        (),
        (str,),
        "module(s) imported first, to register user terms by name (e.g. mypkg.terms); "
        "imported again in every worker process",
        many=True,
    )
    #: Parameters of the terms (n_neighbors, knn, n_probe, ...), by name; each term takes
    #: the ones it declares.
    term_params: tuple[tuple[str, Any], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Extra corpus columns the terms read (their ``requires_columns``), each once."""
        import_term_modules(self.term_modules)
        wanted = [c for name in self.algorithm for c in TERMS[name].requires_columns]
        return tuple(dict.fromkeys(wanted))

    def all_params(self) -> dict[str, Any]:
        """Every parameter of the terms, given or default (what the objective ran with)."""
        out: dict[str, Any] = {}
        for name in self.algorithm:
            for key, value in _own_defaults(TERMS[name]).items():
                out.setdefault(key, value)  # the first term declaring one wins
        return {**out, **dict(self.term_params)}

    def make(self) -> Objective:
        """The objective: one term per name in ``algorithm``, weighted equally."""
        import_term_modules(self.term_modules)
        return resolve_objective(None, self.algorithm, self.lamb, params=dict(self.term_params))


@dataclass(frozen=True)
class SelectorSpec:
    """The method, the budget and what every method shares; the rest goes in ``params``."""

    method: str = _option("mask", _method_names, "selector (mask: the DATAMASK learner)")
    select_ratio: float = _option(
        DEFAULT_SELECT_RATIO, (_RATIO,), "fraction of documents kept, in (0, 1)"
    )
    seed: int = _option(
        0, (Interval(int, 0, 2**63 - 1, closed="both"),), "seed of every random draw"
    )
    device: str = _option("auto", (_device_name,), "auto, cpu, cuda or cuda:N")
    max_similarity: float | None = _option(
        None,
        (Interval(float, -1, 1, closed="right"), None),
        "hard cap: no two selected documents with cosine similarity above this, e.g. 0.95",
    )
    #: The method's own parameters (its ``_parameter_constraints``), by name.
    params: tuple[tuple[str, Any], ...] = ()

    def make(
        self,
        objective: Objective,
        *,
        k: int | None = None,
        seed: int | None = None,
        device: str | None = None,
        progress: bool = False,
    ) -> Any:
        """A fresh selector of ``method`` (``k``: keep exactly that many instead)."""
        cls = SELECTORS[self.method]
        return cls(
            objective,
            select_ratio=self.select_ratio,
            k=k,
            seed=self.seed if seed is None else seed,
            device=device or self.device,
            progress=progress,
            max_similarity=self.max_similarity,
            **dict(self.params),
        )


@dataclass(frozen=True)
class ColumnsSpec:
    """Which columns hold the id, the quality score(s) and the embedding."""

    id_col: str = _option("chunk_id", (str,), "id column")
    quality_cols: tuple[str, ...] = _option(
        ("quality_score",), (str,), "quality column(s), mixed by quality_weights", many=True
    )
    quality_weights: tuple[float, ...] | None = None
    feature_col: str = _option("feature_arr", (str,), "embedding column")

    @property
    def read(self) -> list[str]:
        """Columns read from every shard, each once."""
        return list(dict.fromkeys([self.id_col, *self.quality_cols, self.feature_col]))


@dataclass(frozen=True)
class PartitionSpec:
    """How a sharded corpus is split into groups and how the budget is shared."""

    partition: str = _option(
        "shard",
        (Options(str, ("shard", "chunk", "cluster")),),
        "selection groups: one per shard, fixed-size chunks of rows, or k-means clusters of "
        "the embeddings",
    )
    chunk_size: int = _option(
        100_000,
        (_COUNT,),
        "rows per group for --partition chunk, and the largest cluster group before it is "
        "split for --partition cluster",
    )
    n_clusters: int | None = _option(
        None, (_COUNT, None), "k-means clusters for --partition cluster (None: N / chunk-size)"
    )
    kmeans_sample: int = _option(100_000, (_COUNT,), "rows sampled to fit the k-means centroids")
    budget: str = _option(
        "global",
        (Options(str, ("global", "group")),),
        "global: exactly round(select-ratio * N) over the corpus from the groups' "
        "candidates (--partition cluster with quality + facility: one threshold over their "
        "gains in J; otherwise one more round over their union); group: each group keeps "
        "its proportional share",
    )
    oversample: float = _option(
        2.0,
        (Interval(float, 1, None, closed="left"),),
        "--budget global: candidates per group as a multiple of its proportional share "
        "(exact merges for topk and random need none)",
    )


@dataclass(frozen=True)
class RunSpec:
    """How the run is carried out; none of it changes the selection."""

    selected_only: bool = _option(
        False, (bool,), "write only the selected ids (and their rank)", fingerprint=True
    )
    progress: bool = _option(True, (bool,), "show progress bars")
    threads: int | None = _option(
        None,
        (Interval(int, 1, None, closed="left"), None),
        "CPU threads of torch and numpy (None: the cores available)",
    )
    workers: int | None = _option(
        None,
        (_COUNT, None),
        "groups selected at once (None: the cores available here; with Ray, every GPU of the "
        "cluster, else every CPU)",
    )
    runner: str | None = _option(
        None,
        (Options(str, ("local", "ray")), None),
        "local: a process pool of --workers on this machine; ray: Ray tasks, for a cluster "
        "(None: local, ray when --ray-address is given)",
    )
    ray_address: str | None = _option(
        None, (str, None), "address of a running Ray cluster, e.g. auto or ray://head:10001"
    )
    work_dir: str | None = _option(
        None,
        (str, None),
        "per-group results and completion markers, for resuming (None: OUTPUT/_work)",
    )


SECTIONS: dict[str, type] = {
    "objective": ObjectiveSpec,
    "selector": SelectorSpec,
    "columns": ColumnsSpec,
    "partition": PartitionSpec,
    "run": RunSpec,
}


# --- the options, from the sections and the owners' tables ------------------------------------
def options(section: type) -> list[Option]:
    """The :class:`Option` of every declared field of a spec section."""
    out = []
    for f in fields(section):
        if "option" not in f.metadata:
            continue
        constraints, help, kw = f.metadata["option"]
        kw = {k: v for k, v in kw.items() if k != "fingerprint"}
        out.append(Option(f.name, f.default, constraints, help, **kw))
    return out


def _fingerprinted(section: type, name: str) -> bool:
    if section is not RunSpec:
        return True
    f = {f.name: f for f in fields(section)}[name]
    return bool(f.metadata["option"][2].get("fingerprint"))


#: Constructor arguments every selector shares (fields of SelectorSpec or set by the
#: pipeline), never taken from a method's own table.
_SHARED = frozenset(
    {
        "objective",
        "algorithm",
        "lamb",
        "select_ratio",
        "k",
        "seed",
        "device",
        "progress",
        "max_similarity",
        "graph",
        "log_every",
        "dense_max_bytes",
    }
)


@cache
def _doc_params(cls: type) -> dict[str, str]:
    """Each parameter's description in the numpydoc of ``cls`` (and its bases), markup
    removed: the help of the flag made from it, so the text is written once."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) or ""
        section = re.search(r"Parameters\n-+\n(.*?)(?:\n\n[A-Z][a-z]+\n-+\n|\Z)", doc, re.S)
        if not section:
            continue
        for m in re.finditer(r"^(\w[\w, ]*) :[^\n]*\n((?:    [^\n]*\n?)+)", section.group(1), re.M):
            text = " ".join(m.group(2).split())
            text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
            for name in m.group(1).split(","):
                out[name.strip()] = text.rstrip(".")
    return out


def _default(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        p = inspect.signature(klass.__init__).parameters.get(name)
        if p is not None and p.default is not inspect.Parameter.empty:
            return p.default
    return None


def _own_defaults(cls: type) -> dict[str, Any]:
    """The defaults of the parameters ``cls`` declares as its own (not the shared ones)."""
    table = cls._parameter_constraints
    return {key: _default(cls, key) for key in table if key not in _SHARED}


def _owned_options(owners: Mapping[str, type]) -> list[Option]:
    """One option per parameter any owner declares, listing who takes it."""
    found: dict[str, Option] = {}
    for owner, cls in owners.items():
        for name, constraints in cls._parameter_constraints.items():
            if name in _SHARED:
                continue
            if name in found:
                prev = found[name]
                found[name] = replace(prev, owners=(*prev.owners, owner), default=None)
                continue
            help = _doc_params(cls).get(name, name.replace("_", " "))
            found[name] = Option(
                name, _default(cls, name), tuple(constraints), help, owners=(owner,)
            )
    return list(found.values())


def selector_options() -> list[Option]:
    """The options of every registered method's own parameters."""
    return _owned_options(SELECTORS)


def term_options() -> list[Option]:
    """The options of every registered term's parameters (import user terms first)."""
    return _owned_options(TERMS)


def _all_options() -> dict[str, tuple[str, Option]]:
    """Flat key -> (where it goes, option): a section name, "selector" or "term"."""
    table: dict[str, tuple[str, Option]] = {}
    for where, section in SECTIONS.items():
        for opt in options(section):
            table[opt.name] = (where, opt)
    for opt in selector_options():
        table.setdefault(opt.name, ("selector_params", opt))
    for opt in term_options():
        table.setdefault(opt.name, ("term_params", opt))
    return table


def check_settings(
    values: Mapping[str, Any], *, where: str = "settings"
) -> dict[str, tuple[str, Any]]:
    """Flat settings checked against their options: key -> (where it goes, value).

    None means "the default" and is dropped. ``quality_col`` (``NAME`` or ``NAME:WEIGHT``
    specs, as the flag takes them) becomes ``quality_cols`` and ``quality_weights``. User
    terms' modules (``term_modules``) are imported first, so their parameters are known.
    Errors name the key and ``where``: ``seed in config file 'run.yaml' must be ...``.
    """
    values = {str(k).replace("-", "_"): v for k, v in values.items() if v is not None}
    modules = values.get("term_modules", ())
    import_term_modules((modules,) if isinstance(modules, str) else tuple(modules))
    values = split_quality(values)
    table = _all_options()
    unknown = sorted(set(values) - set(table) - {"quality_weights"})
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} in {where}; known: {sorted(table)}.")
    out: dict[str, tuple[str, Any]] = {}
    for key, value in values.items():
        if key == "quality_weights":
            out[key] = ("columns", tuple(float(w) for w in value))
            continue
        where_to, opt = table[key]
        try:
            out[key] = (where_to, opt.check(value))
        except (TypeError, ValueError) as exc:
            if where == "settings":
                raise
            text = str(exc).replace(f"{key} must", f"{key} in {where} must", 1)
            raise type(exc)(text) from None
    return out


# --- the whole spec ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SelectSpec:
    """Everything that decides a selection and how it is run. Build it with
    :meth:`from_mapping` (flat keys, as in a config file or the flags), check it with
    :meth:`check`.
    """

    objective: ObjectiveSpec = ObjectiveSpec()
    selector: SelectorSpec = SelectorSpec()
    columns: ColumnsSpec = ColumnsSpec()
    partition: PartitionSpec = PartitionSpec()
    run: RunSpec = RunSpec()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> SelectSpec:
        """A spec from flat keys (``select_ratio``, ``n_epochs``, ``partition``, ...).

        None means "the default". Every value is checked against its option; an unknown key
        raises a ValueError naming it. ``quality_weights`` (one per quality column) and the
        keys of user terms (after ``term_modules`` is imported) are accepted too.
        """
        checked = check_settings(values, where=where)
        parts: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        selector_params: dict[str, Any] = {}
        term_values: dict[str, Any] = {}
        for key, (where_to, value) in checked.items():
            if where_to == "selector_params":
                selector_params[key] = value
            elif where_to == "term_params":
                term_values[key] = value
            else:
                parts[where_to][key] = value
        method = parts["selector"].get("method", SelectorSpec.method)
        own = SELECTORS[method]._parameter_constraints
        other = sorted(set(selector_params) - set(own))
        if other:  # e.g. a shared config file with learner settings, run with --method topk
            warnings.warn(
                f"{', '.join(other)} {'is' if len(other) == 1 else 'are'} not a parameter of "
                f"method {method!r} and {'is' if len(other) == 1 else 'are'} ignored.",
                UserWarning,
                stacklevel=2,
            )
        selector_params = {k: v for k, v in selector_params.items() if k in own}
        parts["selector"]["params"] = tuple(sorted(selector_params.items()))
        parts["objective"]["term_params"] = tuple(sorted(term_values.items()))
        return cls(**{name: SECTIONS[name](**kw) for name, kw in parts.items()}).check()

    def check(self) -> SelectSpec:
        """Refuse what no single option can see: parameters the method does not take, terms
        that are not registered, a cap the global merge cannot honour. Returns self."""
        method = self.selector.method
        cls = SELECTORS[method]
        own = set(cls._parameter_constraints)
        stray = sorted(set(dict(self.selector.params)) - own)
        if stray:
            takes = sorted(own) or "none of its own"
            raise ValueError(
                f"{', '.join(stray)} is not a parameter of method {method!r} (it takes "
                f"{takes}); drop it or choose another --method."
            )
        import_term_modules(self.objective.term_modules)
        for name in self.objective.algorithm:
            if name not in TERMS:
                raise ValueError(f"algorithm must be one of {list(TERMS)}; got {name!r}.")
        cols = self.columns
        if not cols.quality_cols:
            raise ValueError("quality_cols must name at least one column; got none.")
        if cols.quality_weights is not None and len(cols.quality_weights) != len(cols.quality_cols):
            raise ValueError(
                f"quality_weights must have one weight per quality column "
                f"({len(cols.quality_cols)}); got {list(cols.quality_weights)}."
            )
        if (
            cls.modular
            and self.selector.max_similarity is not None
            and self.partition.budget == "global"
        ):
            raise ValueError(
                f"max_similarity with --method {method} needs --budget group (the global "
                f"round of {method} merges scores, not documents); got --budget global."
            )
        if self.run.ray_address and self.run.runner == "local":
            raise ValueError("--ray-address needs --runner ray; got --runner local.")
        # The method's parameters (its table, then the rules between them), checked by the
        # selector itself, on the driver, before anything runs.
        selector = self.make_selector(k=1, device="cpu")
        selector.check_params()
        return self

    @property
    def read_columns(self) -> list[str]:
        """Every column a run reads: id, quality, embedding and what the terms require."""
        return list(dict.fromkeys([*self.columns.read, *self.objective.columns]))

    def make_selector(self, **kwargs: Any) -> Any:
        """A fresh selector of the method with its objective (``kwargs``: ``k``, ``seed``,
        ``device``, ``progress``, see :meth:`SelectorSpec.make`)."""
        return self.selector.make(self.objective.make(), **kwargs)

    def flat(self) -> dict[str, Any]:
        """Every setting under its flat key: the sections' fields, then every parameter of
        the method and of the objective's terms, defaults filled in (what made a selection,
        as its summary and the resume fingerprint record it)."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            for f in fields(section):
                if f.name not in ("params", "term_params"):
                    out[f.name] = getattr(section, f.name)
        out.update(_own_defaults(SELECTORS[self.selector.method]))
        out.update(dict(self.selector.params))
        out.update(self.objective.all_params())
        return out

    def fingerprint(self) -> dict[str, Any]:
        """The settings that decide the selection (what a resumed run must match)."""
        out = self.flat()
        for f in fields(RunSpec):
            if not _fingerprinted(RunSpec, f.name):
                out.pop(f.name, None)
        return out


def split_quality(values: Mapping[str, Any]) -> dict[str, Any]:
    """``quality_col`` (``NAME`` / ``NAME:WEIGHT`` specs or pairs, as the flag takes them)
    replaced by ``quality_cols`` and ``quality_weights``; other keys kept.

    >>> split_quality({"quality_col": ["edu:2", "quality_score"]})
    {'quality_cols': ['edu', 'quality_score'], 'quality_weights': [2.0, 1.0]}
    """
    out = dict(values)
    if out.get("quality_col") is None:
        out.pop("quality_col", None)
        return out
    specs = out.pop("quality_col")
    pairs = [
        quality_spec(v) if isinstance(v, str) else (str(v[0]), float(v[1]))
        for v in (specs if isinstance(specs, list | tuple) else [specs])
    ]
    out["quality_cols"] = [name for name, _ in pairs]
    out.pop("quality_weights", None)
    if any(w != 1.0 for _, w in pairs):
        out["quality_weights"] = [w for _, w in pairs]
    return out


def quality_spec(text: str) -> tuple[str, float]:
    """``name`` or ``name:weight`` -> (name, weight).

    >>> quality_spec("edu:2"), quality_spec("quality_score")
    (('edu', 2.0), ('quality_score', 1.0))
    """
    name, sep, weight = text.rpartition(":")
    if not sep:
        return text, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise ValueError(f"--quality-col takes NAME or NAME:WEIGHT; got {text!r}.") from None
    if not value >= 0:
        raise ValueError(f"quality weight must be >= 0; got {text!r}.")
    return name, value


# --- config files -----------------------------------------------------------------------------
def load_config(path: str | Path) -> dict[str, Any]:
    """The flat settings of a YAML or TOML file; keys may use ``-`` or ``_``."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"config file {str(path)!r} is a folder; give a YAML or TOML file.")
    if not p.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist.")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"config file {str(path)!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at "
            f"line {line}; save it as UTF-8."
        ) from None
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:
        raise ValueError(f"cannot parse config file {str(path)!r}: {_config_error(exc)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of settings.")
    flat: dict[str, Any] = {}
    spelt: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in flat:  # select-ratio and select_ratio: which one is meant is unknown
            raise ValueError(
                f"config file {str(path)!r} gives {name} twice ({spelt[name]!r} and "
                f"{str(key)!r}); keep one."
            )
        flat[name], spelt[name] = value, str(key)
    return flat


def _config_error(exc: Exception) -> str:
    """A parser's error in one line: the problem and where (YAML's are several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}."
    return " ".join(str(exc).split())


def iter_options() -> Iterator[tuple[str, Option]]:
    """Every option with where it goes, in declaration order (the CLI's flags)."""
    yield from _all_options().values()
