"""One frozen :class:`EvaluateSpec`: everything ``datamask evaluate`` (and
:func:`datamask.evaluation.evaluate_run.evaluate_file`) runs with besides its places (input,
selection, output), declared once and checked once, where the command line and the library
meet.

Every setting is shared with the spec that owns it (:func:`~datamask.settings.shared_field`):
the objective is ``select``'s :class:`~datamask.config.ObjectiveSpec`; ``device``, ``given``
and ``given_selection`` are :class:`~datamask.config.SelectorSpec`'s; ``dup_thresholds`` and
``dup_search`` are :class:`~datamask.evaluation.redundancy.DuplicateSettings`'; ``split``,
``length_col`` and ``trust_selection`` are :class:`~datamask.io.input_settings.InputSettings`'.
``datamask evaluate``'s flags are made from these declarations.

    >>> spec = EvaluateSpec.from_mapping({"algorithm": ["Facility", "DiSF"], "lamb": 0.3})
    >>> spec.objective.algorithm, spec.objective.lamb, spec.device
    (('Facility', 'DiSF'), 0.3, 'auto')
    >>> EvaluateSpec(given_selection="kept.parquet")
    Traceback (most recent call last):
    ...
    ValueError: --given-selection needs --given, the documents it selects from; got --given-selection 'kept.parquet' alone.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..columns import Columns
from ..config import ObjectiveSpec, SelectorSpec
from ..io.input_settings import InputSettings
from ..objectives.registry import import_term_modules
from ..settings import Spec, as_names, flat_values, fold_columns, shared_field
from .redundancy import DuplicateSettings, check_thresholds

__all__ = ["EvaluateSpec"]


@dataclass(frozen=True)
class EvaluateSpec(Spec):
    """Everything an evaluation runs with besides where it reads and writes. Build it with
    :meth:`from_mapping` (flat keys, as the flags give them) or directly.

    ``objective`` is what the selection is scored with (its ``algorithm`` and ``lamb``; the
    terms' parameters score ``given``); ``columns`` names the id, quality and embedding
    columns as ``select`` names them (names not given are resolved against the input's
    schema).
    """

    objective: ObjectiveSpec = ObjectiveSpec()
    columns: Columns = Columns()
    split: str | None = shared_field(InputSettings, "split")
    length_col: str | None = shared_field(InputSettings, "length_col")
    device: str = shared_field(SelectorSpec, "device")
    dup_thresholds: tuple[float, ...] = shared_field(DuplicateSettings, "dup_thresholds")
    dup_search: str = shared_field(DuplicateSettings, "dup_search")
    given: str | None = shared_field(SelectorSpec, "given")
    given_selection: str | None = shared_field(SelectorSpec, "given_selection")
    trust_selection: bool = shared_field(InputSettings, "trust_selection")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "dup_thresholds", check_thresholds(self.dup_thresholds))
        if not isinstance(self.objective, ObjectiveSpec):
            raise TypeError(f"objective must be an ObjectiveSpec; got {self.objective!r}.")
        if not isinstance(self.columns, Columns):
            raise TypeError(f"columns must be a datamask.Columns; got {self.columns!r}.")
        if self.given_selection is not None and self.given is None:
            raise ValueError(
                "--given-selection needs --given, the documents it selects from; got "
                f"--given-selection {self.given_selection!r} alone."
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> EvaluateSpec:
        """A spec from flat keys: its fields, and the objective's keys (``algorithm``,
        ``lamb``, ``term_modules`` and every term's parameters) instead of ``objective``.
        None means "the default"; an unknown key raises a ValueError naming it."""
        values = fold_columns(cls, values)  # id_col, quality_col, ... -> columns
        import_term_modules(as_names(values.get("term_modules", ())))  # their keys are known
        objective_keys = ObjectiveSpec.flat_keys()
        own = flat_values(cls, {k: v for k, v in values.items() if k not in objective_keys}, where)
        rest = {k: v for k, v in values.items() if k in objective_keys}
        own["objective"] = ObjectiveSpec.given_or_flat(values, rest, where)
        return cls(**own)

    @classmethod
    def flat_keys(cls) -> list[str]:
        """Every flat key :meth:`from_mapping` takes."""
        return [*(f.name for f in fields(cls)), *sorted(ObjectiveSpec.flat_keys())]
