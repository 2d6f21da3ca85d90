"""Every reader and writer: corpora from parquet, JSON lines, save_to_disk and Hub folders;
shards; selections and keep lists; atomic writes and output claims; local and remote
storage (s3, gs, hf) with retries; integrity records and their checks."""

from .atomic import (
    OutputLock,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    check_no_overlap,
    check_writable,
    clean_stale_temporaries,
)
from .datasets import is_save_to_disk, read_input_corpus, read_save_to_disk, resolve_input
from .parquet import (
    atomic_write_table,
    features_from_arrow,
    read_corpus,
    read_summary,
    summary_path,
    write_selection,
)

__all__ = [
    "OutputLock",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_table",
    "atomic_write_text",
    "check_no_overlap",
    "check_writable",
    "clean_stale_temporaries",
    "features_from_arrow",
    "is_save_to_disk",
    "read_corpus",
    "read_input_corpus",
    "read_save_to_disk",
    "read_summary",
    "resolve_input",
    "summary_path",
    "write_selection",
]
