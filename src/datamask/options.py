"""One setting, declared once: :class:`Option` and the options read from their declarations.

A setting is declared either as a field of a spec section (:mod:`datamask.config`,
:class:`datamask.columns.Columns`; with :func:`datamask._validation.option_field`) or in
the constraint table of the selector or term that owns it (``_parameter_constraints``,
scikit-learn's model). :func:`options`, :func:`selector_options`
and :func:`term_options` read them back as :class:`Option` values: what the command line
makes its flags from (:mod:`datamask.cli.args`), what a config file's keys are checked
against, and what :class:`~datamask.config.SelectSpec` fills its defaults from.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any

from ._validation import Interval, Options, validate_params
from .objectives.registry import TERMS
from .selectors import SELECTORS

__all__ = [
    "Option",
    "check_fields",
    "check_option",
    "options",
    "own_defaults",
    "selector_options",
    "shared_field",
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


def shared_field(section: type, name: str) -> Any:
    """A dataclass field declared as field ``name`` of ``section``: the same default, checks
    and help. One setting in two specs (``bench``'s ``seed`` is ``select``'s) is declared
    once, in the section that owns it."""
    owned = {f.name: f for f in fields(section)}[name]
    return field(default=owned.default, metadata=owned.metadata)


def check_option(opt: Option, value: Any, *, where: str = "settings") -> Any:
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
    for opt in options(type(spec)):
        checked = check_option(opt, getattr(spec, opt.name), where=where)
        object.__setattr__(spec, opt.name, checked)  # frozen: the value, normalised


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


def own_defaults(cls: type) -> dict[str, Any]:
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
