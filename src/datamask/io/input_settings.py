"""The settings of how a command reads its input and checks a selection against it, declared
once (:class:`InputSettings`) and shared by the specs of ``apply``, ``evaluate`` and
``report``, and its length column with ``select`` (:func:`~datamask.settings.shared_field`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import setting_field

__all__ = ["InputSettings"]


@dataclass(frozen=True)
class InputSettings:
    """Which split is read, which column gives lengths, and the provenance escape hatch."""

    split: str | None = setting_field(
        None,
        (str, None),
        "split of a DatasetDict save_to_disk folder or of a Hub-style parquet folder "
        "(default: the only one)",
    )
    length_col: str | None = setting_field(
        None,
        (str, None),
        "column of each document's length, numbers (tokens, characters or bytes) or texts "
        "(their characters): what select's token budget counts and evaluate and report "
        "show (default: the first of n_chars, length, n_tokens, text present)",
    )
    trust_selection: bool = setting_field(
        False,
        (bool,),
        "skip the check that the input is what the selection was made from (its recorded "
        "fingerprints, docs/provenance.md)",
    )
