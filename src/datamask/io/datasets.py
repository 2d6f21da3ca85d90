"""Inputs in the Hugging Face ecosystem's shapes.

* A ``datasets`` ``save_to_disk`` folder: a ``Dataset`` (``state.json`` naming Arrow stream
  files ``data-00000-of-0000N.arrow``) or a ``DatasetDict`` (``dataset_dict.json`` and one
  such folder per split). The Arrow files are memory-mapped and only the columns a
  selection needs are read; the ``datasets`` package itself is not needed.
* A Hub-style parquet folder: ``data/train-00000-of-00004.parquet``,
  ``default/train/0000.parquet`` (the Hub's parquet conversion), ``train.parquet`` and the
  like. When such a folder holds several splits, one must be chosen (``split=``): selecting
  over train and test together is almost never meant.

:func:`resolve_input` turns either into what the readers take, and
:func:`read_input_corpus` reads a parquet file or a ``save_to_disk`` folder into a
:class:`~datamask.data.Corpus`.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..columns import Columns
from ..data import Corpus
from .fs import Location, open_input, storage_path
from .parquet import (
    corpus_from_table,
    corpus_from_tables,
    feature_width,
    open_parquet,
    read_corpus,
    read_table,
)
from .shards import PARQUET_SUFFIXES, list_shards, literal_or_glob

__all__ = [
    "embedding_size",
    "is_sharded",
    "SPLIT_NAMES",
    "is_save_to_disk",
    "save_to_disk_files",
    "read_save_to_disk",
    "hub_splits",
    "resolve_input",
    "input_column_names",
    "read_input_corpus",
    "input_files",
    "input_batches",
]

#: Split names recognised in Hub-style paths (as ``datasets``' data-files patterns do).
SPLIT_NAMES = ("train", "validation", "valid", "dev", "test", "eval")


def is_save_to_disk(path: str | Path) -> bool:
    """True for a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    p = Path(path)
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def is_sharded(source: Any) -> bool:
    """A list of files, a folder (not a save_to_disk one) or a glob, local or remote; a file
    whose name holds ``[``, ``*`` or ``?`` is taken literally."""
    if isinstance(source, list | tuple):
        return True
    path = str(source)
    loc = storage_path(path)
    if isinstance(loc, Location):  # a URI: a glob in its path, or a folder
        return literal_or_glob(loc.path) == "glob" or loc.is_dir()
    if is_save_to_disk(path):
        return False
    return Path(path).is_dir() or literal_or_glob(path) == "glob"


def _read_json(path: Path, pick: Callable[[Any], Any]) -> Any:
    """``pick`` of the JSON in ``path``: a ValueError naming the file when it cannot be
    read, is not JSON, or lacks what ``pick`` takes from it."""
    try:
        return pick(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc}") from None


def _dict_splits(root: Path) -> list[str]:
    splits = _read_json(root / "dataset_dict.json", lambda d: d["splits"])
    return [str(s) for s in splits]


def save_to_disk_files(path: str | Path, split: str | None = None) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder, in order.

    Parameters
    ----------
    path : str or Path
        A ``Dataset`` folder, or a ``DatasetDict`` folder (then ``split`` picks one split;
        it may be omitted when there is only one).
    split : str, optional
        The split of a ``DatasetDict``.

    Raises
    ------
    ValueError
        For an unknown split, several splits and none chosen, or a missing Arrow file.
    """
    root = Path(path)
    if (root / "dataset_dict.json").is_file():
        splits = _dict_splits(root)
        if split is None:
            if len(splits) != 1:
                raise ValueError(
                    f"{str(root)!r} is a DatasetDict with splits {splits}; choose one with "
                    "--split NAME (split= in Python)."
                )
            split = splits[0]
        if split not in splits:
            raise ValueError(f"split must be one of {splits} in {str(root)!r}; got {split!r}.")
        root = root / split
    elif split is not None and split != _own_split(root):
        raise ValueError(
            f"{str(root)!r} is a single Dataset, not a DatasetDict; drop --split {split}."
        )
    names = _read_json(root / "state.json", lambda s: [f["filename"] for f in s["_data_files"]])
    files = [root / n for n in names]
    for f in files:
        if not f.is_file():
            raise ValueError(f"Arrow file {str(f)!r} named in state.json does not exist.")
    if not files:
        raise ValueError(f"{str(root)!r} holds no Arrow files.")
    return files


def _own_split(root: Path) -> str | None:
    try:
        return json.loads((root / "state.json").read_text()).get("_split")
    except (OSError, ValueError, AttributeError):
        return None


def _open_stream(path: Path) -> pa.ipc.RecordBatchStreamReader:
    try:
        return pa.ipc.open_stream(pa.memory_map(str(path), "r"))
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise ValueError(f"cannot read {str(path)!r} as an Arrow stream: {exc}") from None


def read_save_to_disk(
    path: str | Path, columns: Sequence[str] | None = None, *, split: str | None = None
) -> pa.Table:
    """The rows of a ``save_to_disk`` folder as one table (memory-mapped, ``columns`` only).

    Raises
    ------
    ValueError
        When a column is missing; the message names the file and lists the columns.
    """
    tables = []
    for f in save_to_disk_files(path, split):
        reader = _open_stream(f)
        names = reader.schema.names
        if columns is not None:
            for c in columns:
                if c not in names:
                    raise ValueError(
                        f"column {c!r} not found in {str(f)}; available columns: {names}."
                    )
        try:
            table = reader.read_all()
        except Exception as exc:
            raise ValueError(f"cannot read {str(f)!r} as an Arrow stream: {exc}") from None
        tables.append(table if columns is None else table.select(list(columns)))
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _split_of(rel: Path) -> str | None:
    """The split a Hub-style relative path belongs to, or None."""
    parts = [*rel.parts[:-1], rel.stem]
    for part in parts:
        name = part.lower().removeprefix("partial-")
        for split in SPLIT_NAMES:
            if name == split or re.match(rf"{split}[-_.]", name):
                return split
    return None


def hub_splits(root: str | Path) -> dict[str, list[Path]]:
    """Parquet files below a folder, grouped by the split their path names ('' for none)."""
    base = Path(root)
    out: dict[str, list[Path]] = {}
    for f in sorted(base.rglob("*"), key=str):
        if f.suffix.lower() not in PARQUET_SUFFIXES:
            continue
        rel = f.relative_to(base)
        if any(p.startswith((".", "_")) for p in rel.parts) or not f.is_file():
            continue
        out.setdefault(_split_of(rel) or "", []).append(f)
    return out


def resolve_input(path: str, *, split: str | None = None) -> str | list[str]:
    """What the readers take for ``path``: unchanged, or the files of one Hub split.

    A ``save_to_disk`` folder is returned as is (see :func:`read_input_corpus`). A folder of
    parquet files naming several splits needs ``split``; the files of that split are
    returned as a list. A file or glob is returned unchanged (``split`` must then be None).
    """
    p = Path(path)
    if is_save_to_disk(p):
        save_to_disk_files(p, split)  # checks the split now, before any output
        return path
    if p.is_dir():
        groups = hub_splits(p)
        named = sorted(s for s in groups if s)
        if split is not None:
            if split not in groups:
                raise ValueError(f"split must be one of {named} in {path!r}; got {split!r}.")
            return [str(f) for f in groups[split]]
        if len(named) > 1:
            raise ValueError(
                f"{path!r} holds the splits {named}; choose one with --split NAME "
                "(or give a glob of the files to select from)."
            )
        return path
    if split is not None:
        raise ValueError(f"--split needs a folder of splits; {path!r} is not a folder.")
    return path


def input_column_names(source: str | Sequence[str], *, split: str | None = None) -> list[str]:
    """Column names of an input: a parquet file, folder, glob, file list or save_to_disk."""
    if not isinstance(source, str):
        files = [str(s) for s in source]
    elif is_save_to_disk(source):
        return list(_open_stream(save_to_disk_files(source, split)[0]).schema.names)
    elif Path(source).is_file():
        files = [source]
    elif Path(source).is_dir():
        files = [str(f) for fs in hub_splits(source).values() for f in fs]
    else:
        files = sorted(glob.glob(source, recursive=True))
    if not files and isinstance(source, str):  # a URI, or an empty folder or glob: said
        # so, naming it and what it looks for, not as a column it lacks
        files = [str(f) for f in list_shards(source)]
    if not files:
        raise ValueError(f"the input {list(source)!r} holds no parquet files.")
    try:
        with open_input(sorted(files)[0]) as fh:
            return list(pq.read_schema(fh).names)
    except Exception:  # the reader words the error later
        return []


def read_input_corpus(
    path: str | Path,
    columns: Columns | None = None,
    *,
    split: str | None = None,
    extra_cols: Sequence[str] = (),
) -> Corpus:
    """A parquet file (see :func:`~datamask.io.parquet.read_corpus`), a ``save_to_disk``
    folder, or parquet shards (a folder, glob or list, as ``select`` takes them; read whole,
    in order, quality scaled over all of them) read into a :class:`~datamask.data.Corpus`
    (not yet validated); ``columns`` not given are resolved against its schema."""
    if is_sharded(path):
        return _read_shards(path, columns, split, extra_cols)
    if not is_save_to_disk(path):
        return read_corpus(path, columns, extra_cols=extra_cols)
    where = str(path)
    names = input_column_names(where, split=split)
    columns = (columns or Columns()).resolve(names, where=where)
    wanted = columns.read
    extras = [c for c in extra_cols if c in names and c not in wanted]
    return corpus_from_table(
        read_save_to_disk(path, wanted + extras, split=split), where, columns, extra_cols=extras
    )


def _read_shards(
    path: Any, columns: Columns | None, split: str | None, extra_cols: Sequence[str]
) -> Corpus:
    """:func:`read_input_corpus` of parquet shards (a folder, glob or list)."""
    source, files = _shards(path, split)
    where = str(path) if isinstance(source, str) else f"the {len(source)} input files"
    names = input_column_names(source, split=split)
    columns = (columns or Columns()).resolve(names, where=where)
    wanted = columns.read
    extras = [c for c in extra_cols if c in names and c not in wanted]
    tables = [(read_table(f, wanted + extras), str(f)) for f in files]
    corpus, _ = corpus_from_tables(tables, columns, source=where, extra_cols=extras)
    return corpus


def _shards(path: Any, split: str | None) -> tuple[str | list[str], list[Path]]:
    """Parquet shards (a folder, glob or list) as a source :func:`input_column_names`
    takes, and their files in order."""
    if isinstance(path, list | tuple):
        source = [str(p) for p in path]
        return source, list_shards(source)
    return str(path), input_files(str(path), split=split)[1]


def embedding_size(source: Any, feature_col: str, *, split: str | None = None) -> tuple[int, int]:
    """Rows and embedding width of parquet shards (a folder, glob or list), from their
    footers: no row is read."""
    rows, width = 0, 0
    for f in _shards(source, split)[1]:
        meta = open_parquet(f, "input shard").metadata  # local or remote
        rows += meta.num_rows
        schema = meta.schema.to_arrow_schema()
        if not width and feature_col in schema.names:
            width = feature_width(schema.field(feature_col)) or 0
    return rows, width


def input_files(path: str, *, split: str | None = None) -> tuple[str, list[Path]]:
    """``("parquet", files)`` or ``("arrow", files)``: the files of any input ``select``
    takes (a parquet file, folder or glob, one split of a Hub folder, a save_to_disk
    folder), in a fixed order."""
    resolved = resolve_input(path, split=split)
    if isinstance(resolved, str) and is_save_to_disk(resolved):
        return "arrow", save_to_disk_files(resolved, split)
    return "parquet", list_shards(resolved)


def input_batches(
    path: str,
    columns: Sequence[str],
    *,
    split: str | None = None,
    batch_size: int = 16384,
) -> Iterator[tuple[pa.RecordBatch, str]]:
    """Stream ``columns`` of an input, batch by batch, with the file each batch came from.

    Memory holds one parquet row group (or one Arrow record batch) at a time, whatever the
    input's size: write files with row groups of a few thousand rows to keep it small.

    Raises
    ------
    ValueError
        When a file lacks a column or cannot be read; the message names it.
    """
    kind, files = input_files(path, split=split)
    wanted = list(dict.fromkeys(columns))
    for f in files:
        where = str(f)
        if kind == "arrow":
            reader = _open_stream(f)
            names = reader.schema.names
        else:
            pf = open_parquet(f)  # local or remote
            names = pf.schema_arrow.names
        for c in wanted:
            if c not in names:
                raise ValueError(f"column {c!r} not found in {where}; available columns: {names}.")
        try:
            if kind == "arrow":
                for batch in reader:
                    for lo in range(0, batch.num_rows, batch_size):
                        yield batch.select(wanted).slice(lo, batch_size), where
            else:
                # Row group by row group: pyarrow's iter_batches holds on to read-ahead
                # buffers (measured: peak memory grew with the file, 430 MB at 56k rows,
                # 865 MB at 226k); reading one row group at a time stays flat.
                for i in range(pf.num_row_groups):
                    table = pf.read_row_group(i, columns=wanted)
                    for batch in table.to_batches(max_chunksize=batch_size):
                        yield batch, where
                    del table
        except ValueError:
            raise
        except Exception as exc:  # decoding errors of a corrupt page
            raise ValueError(f"cannot read {where!r}: {exc}") from None
