"""Parquet shards: find them, count their rows from the footer, read row ranges.

Nothing here loads a whole corpus. :func:`inspect_shards` reads footers only (row counts,
row-group sizes, schema); :func:`read_rows` reads the row groups that overlap a range of
rows of one file; :func:`iter_batches` streams one file batch by batch. Every error names
the file it is about.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..data import Corpus
from .parquet import arrays_from_table

__all__ = [
    "ShardInfo",
    "list_shards",
    "inspect_shards",
    "read_rows",
    "iter_batches",
    "corpus_from_tables",
]

#: Anything a user may pass as input: a file, a directory, a glob, a list of files or a
#: ``pyarrow.dataset.FileSystemDataset`` on the local filesystem.
ShardSource = Any


@dataclass(frozen=True)
class ShardInfo:
    """Footer facts about one parquet shard.

    Attributes
    ----------
    path : str
        The file.
    num_rows : int
        Rows in the file, from its footer.
    row_group_rows : tuple of int
        Rows in each row group, in order.
    size_bytes : int
        File size, part of the run fingerprint (a rewritten shard is noticed).
    """

    path: str
    num_rows: int
    row_group_rows: tuple[int, ...]
    size_bytes: int

    def row_group_starts(self) -> np.ndarray:
        """First row of every row group, plus the total at the end (length n_groups + 1)."""
        return np.concatenate([[0], np.cumsum(self.row_group_rows, dtype=np.int64)])


def _hidden(path: Path, root: Path) -> bool:
    """Names starting with '.' or '_' are skipped, as pyarrow's dataset discovery does."""
    return any(part.startswith((".", "_")) for part in path.relative_to(root).parts)


def _inside(path: Path, folders: Sequence[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(f) for f in folders)


def list_shards(source: ShardSource, *, exclude: Sequence[str | Path] = ()) -> list[Path]:
    """The parquet files of ``source``, sorted by path.

    Parameters
    ----------
    source : str, Path, list of paths or pyarrow.dataset.FileSystemDataset
        A parquet file; a directory (every ``*.parquet`` below it, recursively, skipping
        names that start with ``.`` or ``_``); a glob such as ``data/*/part-*.parquet``
        (``**`` recurses); a list of files; or a pyarrow dataset on the local filesystem.
    exclude : sequence of path, default=()
        Folders whose files are never returned (the run's own output and work dir, when
        they lie inside the input directory).

    Returns
    -------
    list of Path
        Sorted, so that group ids and seeds do not depend on the filesystem's order.

    Raises
    ------
    ValueError
        When nothing matches, or a listed file does not exist (the message names it).
    """
    skip = [Path(p).resolve() for p in exclude]
    try:
        import pyarrow.dataset as ds
        from pyarrow import fs as pafs

        if isinstance(source, ds.FileSystemDataset):
            if not isinstance(source.filesystem, pafs.LocalFileSystem):
                raise ValueError(
                    "a pyarrow dataset input must live on the local filesystem; got "
                    f"{type(source.filesystem).__name__}. Give the shard paths instead."
                )
            source = list(source.files)
    except ImportError:  # pragma: no cover - pyarrow.dataset ships with pyarrow
        pass
    if isinstance(source, list | tuple):
        files = [Path(p) for p in source]
        for f in files:
            if not f.is_file():
                raise ValueError(f"input shard {str(f)!r} does not exist.")
        if not files:
            raise ValueError("the list of input shards is empty.")
        return sorted(files, key=str)
    text = str(source)
    if glob.has_magic(text):
        files = [Path(p) for p in glob.glob(text, recursive=True)]
        files = [f for f in files if f.is_file() and not _inside(f, skip)]
        if not files:
            raise ValueError(f"no files match {text!r}.")
        return sorted(files, key=str)
    root = Path(text)
    if not root.exists():
        raise ValueError(f"input {text!r} does not exist.")
    if root.is_file():
        return [root]
    files = [
        f
        for f in root.rglob("*.parquet")
        if f.is_file() and not _hidden(f, root) and not _inside(f, skip)
    ]
    if not files:
        raise ValueError(f"directory {text!r} holds no *.parquet files.")
    return sorted(files, key=str)


def _open(path: str | Path) -> pq.ParquetFile:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"input shard {str(p)!r} does not exist.")
    try:
        return pq.ParquetFile(p)
    except Exception as exc:  # pyarrow raises several types for a bad footer
        raise ValueError(f"cannot read {str(p)!r} as parquet: {exc}") from None


def inspect_shards(files: Sequence[str | Path], *, columns: Sequence[str] = ()) -> list[ShardInfo]:
    """Row counts and row-group sizes of every shard, from the footers alone.

    Parameters
    ----------
    files : sequence of path
        Parquet files.
    columns : sequence of str, default=()
        Columns every shard must have.

    Raises
    ------
    ValueError
        For a missing file, an unreadable footer or a missing column; the message names
        the file.
    """
    infos = []
    for f in files:
        pf = _open(f)
        names = pf.schema_arrow.names
        for name in columns:
            if name not in names:
                raise ValueError(
                    f"column {name!r} not found in {str(f)}; available columns: {names}."
                )
        meta = pf.metadata
        rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        infos.append(ShardInfo(str(f), int(meta.num_rows), rows, os.path.getsize(f)))
    return infos


def read_rows(
    path: str | Path,
    start: int,
    stop: int,
    columns: Sequence[str],
    *,
    row_group_rows: Sequence[int] | None = None,
) -> pa.Table:
    """Rows ``[start, stop)`` of one parquet file, reading only the row groups they touch.

    Parameters
    ----------
    path : str or Path
        The file.
    start, stop : int
        Row range (``0 <= start <= stop <= num_rows``).
    columns : sequence of str
        Columns to read.
    row_group_rows : sequence of int, optional
        Rows per row group when already known (saves re-reading the footer's counts).

    Raises
    ------
    ValueError
        When the file cannot be read (a corrupt page, say); the message names it.
    """
    pf = _open(path)
    try:
        if row_group_rows is None:
            meta = pf.metadata
            row_group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(row_group_rows, dtype=np.int64)])
        if not 0 <= start <= stop <= starts[-1]:
            raise ValueError(
                f"rows [{start}, {stop}) are out of range for {str(path)!r} "
                f"({int(starts[-1])} rows); was the shard rewritten during the run?"
            )
        if start == stop:
            return pf.schema_arrow.empty_table().select(list(columns))
        first = int(np.searchsorted(starts, start, side="right") - 1)
        last = int(np.searchsorted(starts, stop, side="left"))  # exclusive
        table = pf.read_row_groups(list(range(first, last)), columns=list(columns))
    except ValueError:
        raise
    except Exception as exc:  # decompression and decoding errors of a corrupt page
        raise ValueError(f"cannot read {str(path)!r} as parquet: {exc}") from None
    return table.slice(start - int(starts[first]), stop - start)


def iter_batches(
    path: str | Path, columns: Sequence[str], batch_size: int = 65_536
) -> Iterator[pa.RecordBatch]:
    """Stream a file in record batches of at most ``batch_size`` rows."""
    pf = _open(path)
    try:
        yield from pf.iter_batches(batch_size=batch_size, columns=list(columns))
    except Exception as exc:
        raise ValueError(f"cannot read {str(path)!r} as parquet: {exc}") from None


def corpus_from_tables(
    tables: Sequence[tuple[pa.Table, str]],
    *,
    id_col: str,
    quality_cols: Sequence[str],
    quality_weights: Sequence[float] | None,
    feature_col: str,
    source: str,
) -> tuple[Corpus, pa.Array]:
    """One :class:`~datamask.data.Corpus` from pieces read from several files.

    Parameters
    ----------
    tables : sequence of (pyarrow.Table, str)
        Each piece and where it came from (for error messages).
    source : str
        The corpus's ``source`` (e.g. ``"group 7"``).

    Returns
    -------
    corpus : Corpus
        Not yet validated (the learner's ``fit`` does that).
    ids : pyarrow.Array
        The id column exactly as stored, for writing ids back unchanged.
    """
    id_parts, q_parts, f_parts = [], [], []
    width: tuple[int, str] | None = None
    for table, where in tables:
        ids, q, feats = arrays_from_table(
            table, where, id_col=id_col, quality_cols=quality_cols, feature_col=feature_col
        )
        if width is None:
            width = (feats.shape[1], where)
        elif feats.shape[1] != width[0]:
            raise ValueError(
                f"embedding width {feats.shape[1]} in {where} does not match "
                f"{width[0]} in {width[1]}."
            )
        id_parts.append(ids)
        q_parts.append(q)
        f_parts.append(feats)
    if not id_parts:
        raise ValueError(f"{source} has no rows.")
    types = {a.type for a in id_parts}
    if len(types) > 1:
        raise ValueError(
            f"column {id_col!r} has different types across the shards of {source}: "
            f"{sorted(map(str, types))}; store ids with one type."
        )
    ids_arrow = pa.concat_arrays(id_parts) if len(id_parts) > 1 else id_parts[0]
    features = f_parts[0] if len(f_parts) == 1 else np.concatenate(f_parts)
    del f_parts
    corpus = Corpus(
        ids=ids_arrow.to_numpy(zero_copy_only=False),
        quality=np.concatenate(q_parts),
        features=features,
        quality_names=list(quality_cols),
        quality_weights=None if quality_weights is None else np.asarray(quality_weights, float),
        source=source,
    )
    return corpus, ids_arrow
