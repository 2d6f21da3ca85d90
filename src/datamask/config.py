"""One configuration: the frozen spec every entry point builds, checks once and passes on.

A :class:`SelectSpec` is five frozen sections: what is maximised (:class:`ObjectiveSpec`),
by which method (:class:`SelectorSpec`), on which columns (:class:`~datamask.columns.Columns`),
how a corpus is split (:class:`PartitionSpec`) and how the run is carried out (:class:`RunSpec`).
Each setting is declared once, as a field here (:func:`~datamask._validation.setting_field`)
or in the constraint table of the selector or term that owns it (``_parameter_constraints``,
scikit-learn's model); the command line's flags, choices and help, the keys of a YAML/TOML
``--config`` file and the checks are all made from those declarations
(:mod:`datamask.settings`). The spec is what :func:`datamask.select`
runs, what is fingerprinted for resume, and what crosses process boundaries (it pickles).

    >>> spec = SelectSpec.from_mapping({"select_ratio": 0.1, "n_epochs": 50})
    >>> spec.selector.select_ratio, dict(spec.selector.params)["n_epochs"]
    (0.1, 50)
    >>> spec.flat()["algorithm"]
    ('Facility',)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ._device import check_device_name
from ._needs import on_ray, sharded_only
from ._validation import DEFAULT_SELECT_RATIO, Interval, Options
from .base import Selector
from .columns import Columns, quality_spec, split_quality  # noqa: F401 (re-exported)
from .io.input_settings import InputSettings
from .objectives import Objective
from .objectives.combined import DEFAULT_ALGORITHM, DEFAULT_LAMB, resolve_objective
from .objectives.registry import TERMS, import_term_modules
from .partition_spec import COUNT as _COUNT
from .partition_spec import PartitionSpec
from .selectors import SELECTORS
from .settings import (
    BUDGET_KEYS,
    Setting,
    Spec,
    as_names,
    check_setting,
    ignored_fields,
    merge_settings,
    own_defaults,
    owned_settings,
    section_settings,
    setting_field,
    shared_field,
)

__all__ = [
    "Columns",
    "ObjectiveSpec",
    "PartitionSpec",
    "RunSpec",
    "SelectSpec",
    "SelectorSpec",
    "check_settings",
    "iter_settings",
    "selector_settings",
    "quality_spec",
    "split_quality",
    "term_settings",
]


#: What the shared settings accept, declared once: in the selectors' shared table.
_SHARED = {key: tuple(c) for key, c in Selector._shared_constraints.items() if c != "no_validation"}


def _device_name(value: Any) -> bool:
    """A device name a worker can resolve (checked here without touching CUDA)."""
    try:
        check_device_name(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


_device_name.description = "'auto', 'cpu', 'cuda' or 'cuda:N'"  # type: ignore[attr-defined]


def _method_names() -> tuple:
    return (Options(str, tuple(SELECTORS)),)


def _term_names() -> tuple:
    return (Options(str, tuple(TERMS)),)


def selector_settings() -> list[Setting]:
    """The settings of every registered method's own parameters."""
    return owned_settings(SELECTORS)


def term_settings() -> list[Setting]:
    """The settings of every registered term's parameters (import user terms first)."""
    return owned_settings(TERMS)


# --- the five sections ------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveSpec:
    """``J = lamb * quality + (1 - lamb) * mean of the diversity terms``."""

    algorithm: tuple[str, ...] = setting_field(
        (DEFAULT_ALGORITHM,),
        _term_names,
        "diversity term(s), equally weighted: a registered term name (built in: Facility, "
        "Pair_simi, DiSF; --term-module adds yours)",
        many=True,
    )
    lamb: float = setting_field(
        DEFAULT_LAMB, (Interval(float, 0, 1, closed="both"),), "weight of quality in [0, 1]"
    )
    term_modules: tuple[str, ...] = setting_field(
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
            for key, value in own_defaults(TERMS[name]).items():
                out.setdefault(key, value)  # the first term declaring one wins
        return {**out, **dict(self.term_params)}

    def to_mapping(self) -> dict[str, Any]:
        """The flat keys of this objective, as :meth:`from_mapping` takes them."""
        return {
            "algorithm": self.algorithm,
            "lamb": self.lamb,
            "term_modules": self.term_modules,
            **dict(self.term_params),
        }

    def make(self) -> Objective:
        """The objective: one term per name in ``algorithm``, weighted equally."""
        import_term_modules(self.term_modules)
        return resolve_objective(None, self.algorithm, self.lamb, params=dict(self.term_params))

    @staticmethod
    def flat_keys() -> set[str]:
        """The objective's flat keys: its fields' and every registered term's parameters."""
        return {s.name for s in (*section_settings(ObjectiveSpec), *term_settings())}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> ObjectiveSpec:
        """The objective of flat settings (``algorithm``, ``lamb``, ``term_modules``, the
        terms' parameters; other keys and None are left out), checked as ``select`` checks
        them (``term_modules`` imported first, so user terms' keys are known)."""
        import_term_modules(as_names(values.get("term_modules")))
        keys = cls.flat_keys()
        flat = {k: v for k, v in values.items() if k in keys and v is not None}
        return SelectSpec.from_mapping(flat, where=where).objective

    @classmethod
    def given_or_flat(
        cls, values: Mapping[str, Any], other: Mapping[str, Any], where: str
    ) -> ObjectiveSpec:
        """``values["objective"]`` when given, else the objective of the flat keys in
        ``other`` (:meth:`from_mapping`); both at once is refused."""
        flat = sorted(cls.flat_keys() & set(other))
        if "objective" in values and flat:
            raise ValueError(f"give the objective either as objective= or as {flat}, not both.")
        if "objective" in values:
            return values["objective"]
        return cls.from_mapping(other, where=where)


@dataclass(frozen=True)
class SelectorSpec:
    """The method, the budget and what every method shares; the rest goes in ``params``."""

    method: str = setting_field("mask", _method_names, "selector (mask: the DATAMASK learner)")
    select_ratio: float = setting_field(
        DEFAULT_SELECT_RATIO, _SHARED["select_ratio"], "fraction of documents kept, in (0, 1)"
    )
    k: int | None = setting_field(
        None,
        _SHARED["k"],
        "documents kept, instead of --select-ratio (with --given: of the new documents)",
    )
    budget_tokens: float | None = setting_field(
        None,
        _SHARED["budget_tokens"],
        "tokens kept, instead of a number of documents: the kept documents' lengths "
        "(--length-col) sum to at most this and to within one document of it",
    )
    select_token_ratio: float | None = setting_field(
        None,
        _SHARED["select_token_ratio"],
        "share of the corpus' tokens kept, in (0, 1), instead of --select-ratio (needs "
        '--length-col); docs/method.md "Token budgets"',
    )
    length_col: str | None = shared_field(InputSettings, "length_col")
    given: str | None = setting_field(
        None,
        (str, os.PathLike, None),
        "documents already kept (a parquet file, a folder or glob of shards, a save_to_disk "
        "folder or a URI): k documents are selected from --input only, counting the coverage "
        "they add above what these give; docs/incremental.md",
    )
    given_selection: str | None = setting_field(
        None,
        (str, os.PathLike, None),
        "a selection of --given (datamask select output, parquet or text file of ids): only "
        "its selected rows are the documents already kept",
    )
    seed: int = setting_field(0, _SHARED["seed"], "seed of every random draw")
    device: str = setting_field("auto", (_device_name,), "auto, cpu, cuda or cuda:N")
    max_similarity: float | None = setting_field(
        None,
        _SHARED["max_similarity"],
        "hard cap: no two selected documents with cosine similarity above this, e.g. 0.95",
    )
    #: The method's own parameters (its ``_parameter_constraints``), by name.
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def token_budget(self) -> bool:
        """Whether the budget is in tokens (``budget_tokens`` or ``select_token_ratio``)."""
        return self.budget_tokens is not None or self.select_token_ratio is not None

    def __post_init__(self) -> None:
        for name in ("given", "given_selection"):  # a Path is held as its text (it pickles,
            value = getattr(self, name)  # prints and fingerprints as the flag's value)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))

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
            k=self.k if k is None else k,
            budget_tokens=self.budget_tokens,
            select_token_ratio=self.select_token_ratio,
            seed=self.seed if seed is None else seed,
            device=device or self.device,
            progress=progress,
            max_similarity=self.max_similarity,
            **dict(self.params),
        )


@dataclass(frozen=True)
class RunSpec(Spec):
    """How the run is carried out; none of it changes the selection. Its ``progress`` and
    ``threads`` are every spec's (:class:`~datamask.settings.Spec`)."""

    selected_only: bool = setting_field(
        False, (bool,), "write only the selected ids (and their rank)", fingerprint=True
    )
    workers: int | None = setting_field(
        None,
        (_COUNT, None),
        "groups selected at once (None: the cores available here; with Ray, every GPU of the "
        "cluster, else every CPU)",
        needs=sharded_only,
    )
    runner: str | None = setting_field(
        None,
        (Options(str, ("local", "ray")), None),
        "local: a process pool of --workers on this machine; ray: Ray tasks, for a cluster "
        "(None: local, ray when --ray-address is given)",
        needs=sharded_only,
    )
    ray_address: str | None = setting_field(
        None,
        (str, None),
        "address of a running Ray cluster, e.g. auto or ray://head:10001",
        needs=sharded_only,
    )
    gpus_per_task: float | None = setting_field(
        None,
        (Interval(float, 0, 1, closed="right"), None),
        "Ray, when the cluster has GPUs: the share of a GPU each group task asks for "
        "(None: 1 / ceil(workers / GPUs), the workers share the GPUs)",
        needs=on_ray,
    )
    work_dir: str | None = setting_field(
        None,
        (str, None),
        "per-group results and completion markers, for resuming (None: OUTPUT/_work)",
        needs=sharded_only,
    )


SECTIONS: dict[str, type] = {
    "objective": ObjectiveSpec,
    "selector": SelectorSpec,
    "columns": Columns,
    "partition": PartitionSpec,
    "run": RunSpec,
}


# --- the settings, from the sections and the owners' tables ------------------------------------
def _fingerprinted(section: type, name: str) -> bool:
    if section is not RunSpec:
        return True
    f = {f.name: f for f in fields(section)}[name]
    return bool(f.metadata["setting"][2].get("fingerprint"))


def _all_settings() -> dict[str, tuple[str, Setting]]:
    """Flat key -> (where it goes, option): a section name, "selector" or "term"."""
    table: dict[str, tuple[str, Setting]] = {}
    for where, section in SECTIONS.items():
        for opt in section_settings(section):
            table[opt.name] = (where, opt)
    for opt in selector_settings():
        table.setdefault(opt.name, ("selector_params", opt))
    for opt in term_settings():
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
    import_term_modules(as_names(values.get("term_modules")))
    values = split_quality(values)
    table = _all_settings()
    unknown = sorted(set(values) - set(table) - {"quality_weights"})
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} in {where}; known: {sorted(table)}.")
    out: dict[str, tuple[str, Any]] = {}
    for key, value in values.items():
        if key == "quality_weights":
            out[key] = ("columns", tuple(float(w) for w in value))
            continue
        where_to, opt = table[key]
        out[key] = (where_to, check_setting(opt, value, where=where))
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
    columns: Columns = Columns()
    partition: PartitionSpec = PartitionSpec()
    run: RunSpec = RunSpec()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> SelectSpec:
        """A spec from flat keys (``select_ratio``, ``n_epochs``, ``partition``, ...).

        None means "the default". Every value is checked against its option; an unknown key
        raises a ValueError naming it. ``quality_weights`` (one per quality column) and the
        keys of user terms (after ``term_modules`` is imported) are accepted too. The spec
        is checked (:meth:`check`, once); column names not given stay unknown until a door
        resolves them against the input (:meth:`~datamask.columns.Columns.resolve`).
        """
        checked = check_settings(values, where=where)
        given = [key for key in BUDGET_KEYS if key in checked]
        if len(given) > 1:
            got = ", ".join(f"{key}={checked[key][1]}" for key in given)
            raise ValueError(
                "give the budget one way: select_ratio, k, budget_tokens or "
                f"select_token_ratio; got {got}."
            )
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
        spec = cls(**{name: SECTIONS[name](**kw) for name, kw in parts.items()})
        spec.check()  # the columns stay as given: the door resolves them with the input
        return spec

    def to_mapping(self) -> dict[str, Any]:
        """The flat keys :meth:`from_mapping` makes this spec from (None: a default)."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            if hasattr(section, "to_mapping") and not isinstance(section, RunSpec):
                out.update(section.to_mapping())
                continue
            for f in fields(section):
                if f.name != "params":
                    out[f.name] = getattr(section, f.name)
        out.update(dict(self.selector.params))
        if any(getattr(self.selector, key) is not None for key in BUDGET_KEYS[1:]):
            del out["select_ratio"]  # the budget is another; select_ratio is its default
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def of(cls, spec: SelectSpec | None, settings: Mapping[str, Any], *, where: str) -> SelectSpec:
        """The one spec of a door's call: ``spec`` (default: every default) with the keyword
        ``settings`` over it (:meth:`datamask.settings.Spec.of`'s rule)."""
        if spec is None:
            return cls.from_mapping(settings, where=where)
        if not isinstance(spec, cls):
            raise TypeError(f"spec must be a SelectSpec; got {type(spec).__name__}.")
        if not settings:
            return spec
        return cls.from_mapping(merge_settings(spec.to_mapping(), settings), where=where)

    def check(self) -> SelectSpec:
        """Refuse what no single option can see: parameters the method does not take, terms
        that are not registered, a cap the global merge cannot honour.

        Returns the spec to run: this one, or, when column names are still unknown (no
        input's schema resolved them, see :meth:`~datamask.columns.Columns.resolve`), a
        copy with their defaults (``chunk_id``, ``quality_score``, ``feature_arr``). The
        checks run once per spec: a spec already checked (or made from one by
        :meth:`evolve`) skips them, so the doors, the planner and the workers may each ask
        without building the method's throwaway selector again.
        """
        if not self.__dict__.get("_checked"):
            self._check()
        return self if self.columns.resolved else self.evolve(columns=self.columns.resolve())

    def _check(self) -> None:
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
        _check_columns(self.columns)
        if (
            cls.modular
            and self.selector.max_similarity is not None
            and self.partition.budget == "global"
        ):
            raise ValueError(
                f"max_similarity with --method {method} needs --budget group (the global "
                f"round of {method} merges scores, not documents); got --budget global."
            )
        if self.selector.given_selection is not None and self.selector.given is None:
            raise ValueError(
                "given_selection needs given, the documents it selects from; got "
                f"given_selection={self.selector.given_selection!r} alone."
            )
        if self.run.ray_address and self.run.runner == "local":
            raise ValueError("--ray-address needs --runner ray; got --runner local.")
        # The method's parameters (its table, then the rules between them), checked by the
        # selector itself, on the driver, before anything runs.
        selector = self.make_selector(k=1, device="cpu")
        selector.check_params()
        object.__setattr__(self, "_checked", True)  # frozen: a mark, not a setting

    def evolve(self, **sections: Any) -> SelectSpec:
        """This spec with ``columns`` or ``run`` replaced (their names resolved, a staged
        path). Neither changes what :meth:`check` found, so a checked spec stays checked."""
        stray = sorted(set(sections) - {"columns", "run"})
        if stray:
            raise TypeError(f"evolve replaces columns or run only; got {stray}.")
        new = replace(self, **sections)
        if "columns" in sections:
            _check_columns(new.columns)
        if self.__dict__.get("_checked"):
            object.__setattr__(new, "_checked", True)
        return new

    @property
    def read_columns(self) -> list[str]:
        """Every column a run reads: id, quality, embedding and what the terms require."""
        columns = [*self.columns.read, *self.objective.columns]
        sel = self.selector
        if sel.token_budget and sel.length_col is not None:  # a token budget's lengths
            columns.append(sel.length_col)
        return list(dict.fromkeys(columns))

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
                # a preset is resolved into the column names, which are recorded instead
                if f.name not in ("params", "term_params", "preset"):
                    out[f.name] = getattr(section, f.name)
        out.update(own_defaults(SELECTORS[self.selector.method]))
        out.update(dict(self.selector.params))
        out.update(self.objective.all_params())
        return out

    def ignored(self, sharded: bool) -> dict[str, str]:
        """The settings given another value than their default that this run does not read
        (a one-file run's partition settings, --n-clusters with --partition chunk, ...),
        each with why: from the ``needs`` of their declarations. They are warned about at
        the door and not recorded as used (:func:`datamask.pipeline.writer.run_record`)."""
        out: dict[str, str] = {}
        for name in SECTIONS:
            out.update(ignored_fields(getattr(self, name), self, sharded))
        return out

    def fingerprint(self) -> dict[str, Any]:
        """The settings that decide the selection of a sharded run (what a resumed run
        must match, and what its manifest records): a setting it ignores is not one."""
        ignored = self.ignored(sharded=True)
        out = {key: v for key, v in self.flat().items() if key not in ignored}
        for f in fields(RunSpec):
            if not _fingerprinted(RunSpec, f.name):
                out.pop(f.name, None)
        return out


def _check_columns(cols: Columns) -> None:
    given = cols.quality_cols and cols.quality_weights is not None  # else resolved later
    if given and len(cols.quality_weights) != len(cols.quality_cols):
        raise ValueError(
            f"quality_weights must have one weight per quality column "
            f"({len(cols.quality_cols)}); got {list(cols.quality_weights)}."
        )


def iter_settings() -> Iterator[tuple[str, Setting]]:
    """Every option with where it goes, in declaration order (the CLI's flags)."""
    yield from _all_settings().values()
