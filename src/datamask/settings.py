"""One setting, declared once: :class:`Setting` and the settings read from their declarations.

A setting is declared either as a field of a spec (:func:`setting_field`: the sections of
:class:`datamask.config.SelectSpec`, :class:`datamask.columns.Columns`,
:class:`datamask.evaluation.bench_spec.BenchSpec`, :class:`datamask.embedding.EmbedSpec`,
:class:`datamask.applying.spec.ApplySpec`, :class:`datamask.evaluation.evaluate_spec.EvaluateSpec`,
:class:`datamask.io.input_settings.InputSettings`) or in
the constraint table of the selector or term that owns it (``_parameter_constraints``,
scikit-learn's model). :func:`section_settings` and :func:`owned_settings` read them back as
:class:`Setting` values: what the command line makes its flags from
(:mod:`datamask.cli.args`), what a config file's keys are checked against, and what a spec
checks its fields with (:func:`check_fields`).

Words, one meaning each: a *setting* is one declared key (``seed``); a *spec* is the frozen,
checked whole a command runs with (:class:`~datamask.config.SelectSpec`); *settings* are
flat keys and values a spec is made from (``select(..., **settings)``); a *flag* is a
setting's command-line form (``--seed``); :class:`~datamask._validation.Options` is the
constraint "one of these values" (scikit-learn's name).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any

from ._validation import Interval, Options, setting_field, validate_params

__all__ = [
    "SHARED_PARAMS",
    "Setting",
    "Spec",
    "as_names",
    "check_fields",
    "flat_values",
    "check_setting",
    "ignored_fields",
    "owned_settings",
    "own_defaults",
    "section_settings",
    "setting_field",
    "shared_field",
    "warn_ignored_settings",
]


# --- one setting ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
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
            # empty only where the default is (term_modules: none; algorithm needs one)
            if not isinstance(items, list | tuple) or (not items and self.default != ()):
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


def section_settings(section: type) -> list[Setting]:
    """The :class:`Setting` of every declared field of a spec or spec section."""
    out = []
    for f in fields(section):
        if "setting" not in f.metadata:
            continue
        constraints, help, kw = f.metadata["setting"]
        kw = {k: v for k, v in kw.items() if k != "fingerprint"}
        out.append(Setting(f.name, f.default, constraints, help, **kw))
    return out


def shared_field(section: type, name: str) -> Any:
    """A dataclass field declared as field ``name`` of ``section``: the same default, checks
    and help. One setting in two specs (``bench``'s ``seed`` is ``select``'s) is declared
    once, in the section that owns it."""
    owned = {f.name: f for f in fields(section)}[name]
    return field(default=owned.default, metadata=owned.metadata)


def check_setting(opt: Setting, value: Any, *, where: str = "settings") -> Any:
    """``opt.check(value)``; an error names ``where`` after the key unless it is the plain
    "settings" (``seed in config file 'run.yaml' must be ...``)."""
    try:
        return opt.check(value)
    except (TypeError, ValueError) as exc:
        if where == "settings":
            raise
        text = str(exc).replace(f"{opt.name} must", f"{opt.name} in {where} must", 1)
        raise type(exc)(text) from None


def check_fields(spec: Any, *, where: str = "settings") -> None:
    """Every declared field of the frozen dataclass ``spec`` checked against its option and
    held as checked (a list as a tuple, an int as a float where a float is declared). Called
    once, by the spec's ``__post_init__``: a spec that exists is a checked one."""
    for opt in section_settings(type(spec)):
        checked = check_setting(opt, getattr(spec, opt.name), where=where)
        object.__setattr__(spec, opt.name, checked)  # frozen: the value, normalised


# --- the base of every command's spec -------------------------------------------------------
#: The keys of :class:`~datamask.columns.Columns` a flat mapping may hold (``quality_col``:
#: ``NAME`` or ``NAME:WEIGHT`` specs, as the flag takes them).
COLUMN_KEYS = ("id_col", "quality_col", "quality_cols", "quality_weights", "feature_col", "preset")


@dataclass(frozen=True)
class Spec:
    """The base of every command's spec: how a run shows itself and the CPU threads it
    uses, declared once here with one default, and the one way a door makes its spec from
    ``spec=`` and keyword settings (:meth:`of`).

    A spec is frozen and checked when made (``__post_init__``: every declared field against
    its setting). :class:`~datamask.config.SelectSpec` is the one spec made of sections;
    its ``run`` section (:class:`~datamask.config.RunSpec`) is a :class:`Spec`.

    Parameters
    ----------
    progress : bool, default=True
        Show progress bars (stderr).
    threads : int, optional
        CPU threads of torch and numpy (default: the cores available).
    """

    progress: bool = setting_field(True, (bool,), "show progress bars (stderr)")
    threads: int | None = setting_field(
        None,
        (Interval(int, 1, None, closed="left"), None),
        "CPU threads of torch and numpy (None: the cores available)",
    )

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> Any:
        """A spec from flat keys (the flags, a config file, a door's keywords); None means
        "the default"; an unknown key raises a ValueError naming it. A spec with a
        ``columns`` field takes the column keys (``id_col``, ``quality_col``, ``feature_col``,
        ``preset``, ...) as :class:`~datamask.config.SelectSpec` does."""
        return cls(**flat_values(cls, fold_columns(cls, values), where))

    def to_mapping(self) -> dict[str, Any]:
        """The flat keys :meth:`from_mapping` makes this spec from (sections such as
        ``columns`` and ``objective`` spelled as their own keys)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "to_mapping"):  # a section: Columns, ObjectiveSpec
                out.update(value.to_mapping())
            else:
                out[f.name] = value
        return out

    @classmethod
    def of(cls, spec: Any, settings: Mapping[str, Any], *, where: str = "settings") -> Any:
        """The one spec of a door's call: ``spec`` (default: every default), with the keyword
        ``settings`` over it; an unknown key is refused, naming it."""
        if spec is None:
            return cls.from_mapping(settings, where=where)
        if not isinstance(spec, cls):
            raise TypeError(f"spec must be a {cls.__name__}; got {type(spec).__name__}.")
        if not settings:
            return spec
        sections = {
            f.name: set(type(v).flat_keys())
            for f in fields(spec)
            if hasattr(v := getattr(spec, f.name), "flat_keys")  # the objective
        }
        merged = merge_settings(spec.to_mapping(), settings, sections)
        return cls.from_mapping(merged, where=where)


#: The ways a budget is given, one at a time (``select_ratio`` is the default).
BUDGET_KEYS = ("select_ratio", "k", "budget_tokens", "select_token_ratio")


def merge_settings(
    base: Mapping[str, Any],
    over: Mapping[str, Any],
    sections: Mapping[str, set[str]] | None = None,
) -> dict[str, Any]:
    """``over`` over ``base``, flat keys both; a key of ``over`` replaces the ones of
    ``base`` it stands for (``quality_col`` the columns and weights, the
    :data:`BUDGET_KEYS` each other; with ``sections``, e.g. ``{"objective": its keys}``, a
    section given whole replaces its keys, and a key of it the whole)."""
    over = {str(k).replace("-", "_"): v for k, v in over.items()}
    base = dict(base)
    drops = {
        "quality_col": ("quality_cols", "quality_weights"),
        "quality_cols": ("quality_weights",),
        **{key: tuple(o for o in BUDGET_KEYS if o != key) for key in BUDGET_KEYS},
    }
    for key in over:
        for other in drops.get(key, ()):
            base.pop(other, None)
    for name, keys in (sections or {}).items():  # a section given whole, or by its keys
        if name in over:
            base = {k: v for k, v in base.items() if k not in keys}
        if set(over) & set(keys):
            base.pop(name, None)
    return {**base, **over}


def fold_columns(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with its column keys made into one ``columns`` value, for a spec class
    with a ``columns`` field (others: as given); the field's type makes it
    (:meth:`datamask.columns.Columns.from_mapping`)."""
    values = {str(k).replace("-", "_"): v for k, v in values.items() if v is not None}
    own = {f.name: f for f in fields(cls)}
    keys = [k for k in COLUMN_KEYS if k in values]
    if "columns" not in own or not keys:
        return values
    if "columns" in values:
        raise ValueError(f"give the columns either as columns= or as {keys}, not both.")
    section = type(own["columns"].default)
    values["columns"] = section.from_mapping({k: values.pop(k) for k in keys})
    return values


#: Constructor arguments every selector shares (fields of SelectorSpec or set by the
#: pipeline), never taken from a method's own table.
SHARED_PARAMS = frozenset(
    {
        "objective",
        "algorithm",
        "lamb",
        "select_ratio",
        "k",
        "budget_tokens",
        "select_token_ratio",
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


def own_defaults(cls: type) -> dict[str, Any]:
    """The defaults of the parameters ``cls`` declares as its own (not the shared ones)."""
    table = cls._parameter_constraints
    return {key: _default(cls, key) for key in table if key not in SHARED_PARAMS}


def owned_settings(owners: Mapping[str, type]) -> list[Setting]:
    """One setting per parameter any owner (a selector or term class, by its registry name)
    declares in its ``_parameter_constraints``, listing who takes it."""
    found: dict[str, Setting] = {}
    for owner, cls in owners.items():
        for name, constraints in cls._parameter_constraints.items():
            if name in SHARED_PARAMS:
                continue
            if name in found:
                prev = found[name]
                found[name] = replace(prev, owners=(*prev.owners, owner), default=None)
                continue
            help = _doc_params(cls).get(name, name.replace("_", " "))
            found[name] = Setting(
                name, _default(cls, name), tuple(constraints), help, owners=(owner,)
            )
    return list(found.values())


def flat_values(spec_class: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The keys of ``values`` that are fields of ``spec_class`` (``-`` read as ``_``; None
    means "the default" and is dropped); an unknown key raises a ValueError naming it."""
    values = {str(k).replace("-", "_"): v for k, v in values.items() if v is not None}
    known = [f.name for f in fields(spec_class)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} in {where}; known: {known}.")
    return values


def ignored_fields(section: Any, run: Any, sharded: bool = False) -> dict[str, str]:
    """The declared fields of ``section`` given another value than their default that the
    run ``run`` does not read, each with why: ``needs(run, sharded)`` of their declarations
    (see :func:`~datamask._validation.setting_field`)."""
    out: dict[str, str] = {}
    for f in fields(section):
        needs = f.metadata.get("needs")
        if needs is None or getattr(section, f.name) == f.default:
            continue
        why = needs(run, sharded)
        if why is not None:
            out[f.name] = why
    return out


def warn_ignored_settings(
    ignored: Mapping[str, str], values: Mapping[str, Any], *, stacklevel: int = 3
) -> None:
    """Warn, once at the door, of each setting given that the run does not read (one
    wording for every command)."""
    for key, why in ignored.items():
        warnings.warn(
            f"{key}={values[key]!r} is ignored: {why}; it is not recorded as used.",
            UserWarning,
            stacklevel=stacklevel,
        )


def as_names(value: Any) -> tuple:
    """One name or several (``term_modules``, ``methods``) as a tuple; anything else as no
    names (the setting's own check then names what it got)."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list | tuple) else ()
