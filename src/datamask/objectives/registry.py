"""The term registry: reference names -> term classes, and user terms by name.

Built-in terms register themselves under the reference's ``--algorithm`` names
(``Facility``, ``Pair_simi``, ``DiSF``); a user registers a :class:`~datamask.objectives.
Term` subclass in their own module::

    from datamask.objectives import Term, register_term

    @register_term("MyCoverage")
    class MyCoverage(Term):
        ...

Importing that module registers the term again in any process, so a run that carries the
module's name (``term_modules=("mypkg.terms",)``) calls :func:`import_term_modules` in each
spawned or Ray worker before it builds the objective by name.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .._validation import validate_params
from .base import Term

__all__ = [
    "TERMS",
    "import_term_modules",
    "make_term",
    "qualified_name",
    "register_term",
    "term_class",
    "term_names",
    "term_params",
]

#: Registered name -> term class (``datamask.objectives.ALGORITHMS`` is this same dict).
TERMS: dict[str, type[Term]] = {}

T = TypeVar("T", bound=type)

#: The built-in names, listed first and in this order whatever the import order.
_BUILTINS = ("Facility", "Pair_simi", "DiSF")


def qualified_name(cls: type) -> str:
    """``module:QualName`` of a class (what a spec can carry to another process)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_term(name: str) -> Callable[[T], T]:
    """Class decorator: register a :class:`Term` subclass under ``name``.

    Re-registering the same class (its module imported again, e.g. in a worker, or
    reloaded) is allowed; another class under a taken name is refused.

    Raises
    ------
    TypeError
        ``name`` is not a non-empty string, or the class is not a Term subclass.
    ValueError
        ``name`` is taken by another class.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"term name must be a non-empty str; got {name!r}.")

    def decorate(cls: T) -> T:
        if not (inspect.isclass(cls) and issubclass(cls, Term)):
            raise TypeError(
                f"register_term({name!r}) needs a subclass of datamask.objectives.Term; "
                f"got {cls!r}."
            )
        old = TERMS.get(name)
        if old is not None and qualified_name(old) != qualified_name(cls):
            raise ValueError(
                f"term name {name!r} is already registered to {qualified_name(old)}; "
                f"pick another name for {qualified_name(cls)}."
            )
        TERMS[name] = cls
        order = sorted(TERMS, key=lambda t: _BUILTINS.index(t) if t in _BUILTINS else 99)
        items = [(t, TERMS[t]) for t in order]
        TERMS.clear()
        TERMS.update(items)
        return cls

    return decorate


def term_names() -> list[str]:
    """The registered term names, in registration order (built-ins first)."""
    return list(TERMS)


def term_class(name: str, *, what: str = "term") -> type[Term]:
    """The class registered under ``name``; ``what`` names the argument in the error."""
    cls = TERMS.get(name)
    if cls is None:
        raise ValueError(
            f"{what} must be one of {term_names()}; got {name!r}. User terms must be "
            "registered (register_term) by importing their module first."
        )
    return cls


def make_term(name: str, **params: Any) -> Term:
    """A term by its registered name, its parameters checked against the class'
    ``_parameter_constraints``.

    Raises
    ------
    ValueError
        An unknown name (the message lists the registered ones), or a parameter value
        outside its constraints (worded like scikit-learn).
    TypeError
        A parameter the term does not declare.
    """
    cls = term_class(name)
    validate_params(cls.__name__, cls._parameter_constraints, params)
    return cls(**params)


def term_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The items of ``params`` (CLI-level term settings such as ``n_neighbors``, ``knn``,
    ``n_probe``) that the term ``name`` declares; the rest are left out.

    Examples
    --------
    >>> term_params("Pair_simi", {"n_neighbors": 8, "knn": "auto"})
    {}
    >>> term_params("Facility", {"n_neighbors": 8, "lamb": 0.5})
    {'n_neighbors': 8}
    """
    declared = term_class(name)._parameter_constraints
    return {k: v for k, v in params.items() if k in declared}


def import_term_modules(modules: Sequence[str] | Iterable[str]) -> list[str]:
    """Import modules by dotted name so the terms they register exist in this process.

    Workers of the sharded runner (spawned processes, Ray tasks) call this with the run's
    ``term_modules`` before building the objective. Returns the names imported.

    Raises
    ------
    TypeError
        ``modules`` is a single string or holds a non-string.
    ImportError
        A module that cannot be imported, does not parse or raises when imported (named
        in the message, with the file and line).
    """
    if isinstance(modules, str):
        raise TypeError(f"modules must be a sequence of module names; got the str {modules!r}.")
    names = list(modules)
    for mod in names:
        if not isinstance(mod, str) or not mod:
            raise TypeError(f"term module names must be non-empty str; got {mod!r}.")
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise ImportError(
                f"cannot import term module {mod!r}: {exc}; is it on PYTHONPATH in this process?"
            ) from exc
        except SyntaxError as exc:  # the user's file does not parse
            raise ImportError(
                f"term module {mod!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}."
            ) from exc
        except Exception as exc:  # noqa: BLE001 - any error of the user's module code
            where = ""
            tb = exc.__traceback__
            while tb is not None:  # the deepest frame: where in the user's file it raised
                where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})"
                tb = tb.tb_next
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ImportError(
                f"term module {mod!r} raised {type(exc).__name__} when imported{where}"
                + (f": {first}" if first else "")
                + "; fix the module."
            ) from exc
    return names
