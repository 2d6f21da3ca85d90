"""Reading corpora from parquet and writing selections atomically."""

from .parquet import (
    atomic_write_json,
    atomic_write_table,
    features_from_arrow,
    read_corpus,
    selection_table,
    write_selection,
)

__all__ = [
    "atomic_write_json",
    "atomic_write_table",
    "features_from_arrow",
    "read_corpus",
    "selection_table",
    "write_selection",
]
