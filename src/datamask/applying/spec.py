"""One frozen :class:`ApplySpec`: everything ``datamask apply`` (and
:func:`datamask.applying.apply_selection`) runs with besides its places (input, selection,
output, removed), declared once and checked once, where the command line and the library
meet.

Each setting is a field declared with :func:`~datamask.settings.setting_field` (its default,
what it accepts, its help); ``datamask apply``'s flags are made from these declarations. A
spec that exists is checked (``__post_init__``).

    >>> ApplySpec.from_mapping({"removed_format": "rows", "id_col": "id"}).columns.id_col
    'id'
    >>> ApplySpec(batch_size=0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be >= 1; got 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import COUNT, Options
from ..columns import Columns
from ..io.input_settings import InputSettings
from ..settings import Spec, setting_field, shared_field

__all__ = ["REMOVED_FORMATS", "ApplySpec"]

#: Layouts of what ``--removed`` writes (see :mod:`datamask.applying.core`).
REMOVED_FORMATS = ("ids", "rows", "curator")


@dataclass(frozen=True)
class ApplySpec(Spec):
    """Everything an apply runs with besides where it reads and writes. Build it with
    :meth:`from_mapping` (flat keys, as the flags and :func:`datamask.apply`'s keywords
    give them) or directly.

    ``columns`` names the id column as every reader names it: given, else from ``preset``,
    else the first of chunk_id, id in the input (:meth:`~datamask.columns.Columns.resolve_id`);
    apply reads no other column of them.
    """

    removed_format: str = setting_field(
        "ids",
        (Options(str, REMOVED_FORMATS),),
        "ids: <name>.parquet of dropped ids; rows: dropped rows, every column; curator: "
        "part.<i>.parquet with a sorted `id` column for NeMo Curator's "
        "TextDuplicatesRemovalWorkflow",
    )
    columns: Columns = Columns()
    batch_size: int = setting_field(
        65_536,
        (COUNT,),
        "rows per streamed batch (memory is about one batch of every column)",
    )
    #: Apply also checks, without keep lists, that the input's ids are of the selection's
    #: type and that some are selected; the escape hatch skips those too.
    trust_selection: bool = shared_field(InputSettings, "trust_selection")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.columns, Columns):
            raise TypeError(f"columns must be a datamask.Columns; got {self.columns!r}.")

    @property
    def id_col(self) -> str:
        """The id column (of a spec whose columns a door resolved; else chunk_id)."""
        return self.columns.id_col or "chunk_id"
