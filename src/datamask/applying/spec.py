"""One frozen :class:`ApplySpec`: everything ``datamask apply`` (and
:func:`datamask.applying.apply_selection`) runs with besides its places (input, selection,
output, removed), declared once and checked once, where the command line and the library
meet.

Each setting is a field declared with :func:`~datamask.settings.setting_field` (its default,
what it accepts, its help); ``datamask apply``'s flags are made from these declarations. A
spec that exists is checked (``__post_init__``).

    >>> ApplySpec.from_mapping({"removed_format": "rows", "id_col": "id"}).batch_size
    65536
    >>> ApplySpec(batch_size=0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be >= 1; got 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._validation import COUNT, Options
from ..io.input_settings import InputSettings
from ..settings import check_fields, flat_values, setting_field, shared_field

__all__ = ["REMOVED_FORMATS", "ApplySpec"]

#: Layouts of what ``--removed`` writes (see :mod:`datamask.applying.core`).
REMOVED_FORMATS = ("ids", "rows", "curator")


@dataclass(frozen=True)
class ApplySpec:
    """Everything an apply runs with besides where it reads and writes. Build it with
    :meth:`from_mapping` (flat keys, as the flags and :func:`apply_selection`'s keywords
    give them) or directly."""

    removed_format: str = setting_field(
        "ids",
        (Options(str, REMOVED_FORMATS),),
        "ids: <name>.parquet of dropped ids; rows: dropped rows, every column; curator: "
        "part.<i>.parquet with a sorted `id` column for NeMo Curator's "
        "TextDuplicatesRemovalWorkflow",
    )
    id_col: str = setting_field("chunk_id", (str,), "id column of the input shards")
    batch_size: int = setting_field(
        65_536,
        (COUNT,),
        "rows per streamed batch (memory is about one batch of every column)",
    )
    progress: bool = setting_field(True, (bool,), "show a progress bar over rows")
    #: Apply also checks, without keep lists, that the input's ids are of the selection's
    #: type and that some are selected; the escape hatch skips those too.
    trust_selection: bool = shared_field(InputSettings, "trust_selection")

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "settings") -> ApplySpec:
        """A spec from flat keys (the flags, :func:`apply_selection`'s keywords); None means
        "the default"; an unknown key raises a ValueError naming it."""
        return cls(**flat_values(cls, values, where))
