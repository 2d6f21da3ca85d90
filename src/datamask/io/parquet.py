"""Parquet in, parquet out. Column names are parameters; writes are atomic."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._validation import check_finite_quality
from ..columns import Columns
from ..data import Corpus
from .atomic import atomic_write, atomic_write_group, atomic_write_json, to_json
from .dictionary import dictionary_columns
from .fs import Location, expect_file, open_input, storage_path
from .retry import raise_if_unavailable
from .text import text_array

__all__ = [
    "read_corpus",
    "read_in_parallel",
    "corpus_from_table",
    "corpus_from_tables",
    "read_table",
    "parquet_batches",
    "parquet_num_rows",
    "open_parquet",
    "features_from_arrow",
    "features_column",
    "features_matrix",
    "write_selection",
    "atomic_write_table",
    "atomic_write_json",
    "arrays_from_table",
    "check_finite_quality",
    "check_id_type",
    "read_summary",
    "summary_path",
    "SUMMARY_KEY",
]


def open_remote_parquet(loc: Location, what: str = "input file") -> pq.ParquetFile:
    """A parquet file on object storage, read by ranged requests (the footer, then only
    the row groups and columns asked for); a missing one is named as ``what``."""
    try:
        fh = open_input(loc)
    except FileNotFoundError:
        raise ValueError(f"{what} {loc.uri!r} does not exist.") from None
    with parquet_errors(loc.uri):
        return pq.ParquetFile(fh, page_checksum_verification=True)


def open_parquet(path: str | Path | Location, what: str = "input file") -> pq.ParquetFile:
    """A parquet file, local or on object storage (:func:`open_remote_parquet`), its pages'
    checksums verified; a missing one, or a folder, is named as ``what``."""
    p = storage_path(path)
    if isinstance(p, Location):
        return open_remote_parquet(p, what)
    expect_file(p, what=what, accepted="one parquet file")
    with parquet_errors(str(p)):
        return pq.ParquetFile(p, page_checksum_verification=True)


#: A remote parquet object up to this size is read whole by :func:`read_table` (one GET
#: after the open's HEAD), not by its footer and then its column chunks (a request each,
#: each a round trip to the store): at S3's ~20-50 ms a request, 4 MiB is about the bytes
#: one round trip costs.
WHOLE_READ_MAX = 4 << 20


def read_table(
    source: str | Path | Location,
    columns: Sequence[str] | None = None,
    *,
    where: str | None = None,
) -> pa.Table:
    """A whole parquet file (a local path or a :class:`~datamask.io.fs.Location`);
    ``where`` names it in messages (default: its path).

    Raises
    ------
    ValueError
        When the file is missing, lacks one of ``columns`` or cannot be read; the message
        names it.
    """
    name = source.uri if isinstance(source, Location) else str(source)
    with ExitStack() as stack:
        if isinstance(source, Location):
            with parquet_errors(name):
                fh = stack.enter_context(source.open_input_file())
                # a small object in one GET, not a footer read and then one per column
                small = fh.size() <= WHOLE_READ_MAX
                pf = pq.ParquetFile(pa.BufferReader(fh.read()) if small else fh)
        else:
            pf = open_parquet(source)
        if columns is not None:  # a missing column is named, with the file, not a KeyError
            _require(pf.schema_arrow, columns, where or name)
        with parquet_errors(name):
            return pf.read(columns=None if columns is None else list(columns))


def parquet_num_rows(source: Location) -> int:
    """Rows of a parquet file, from its footer alone."""
    with source.open_input_file() as fh:
        return pq.ParquetFile(fh).metadata.num_rows


def parquet_batches(
    source: Location, batch_size: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema of a parquet file and an iterator over its record batches.

    The file is opened now (a bad footer fails here) and closed when the batches run out;
    every error names it.
    """
    fh = source.open_input_file()
    try:
        with parquet_errors(source.uri):
            pf = pq.ParquetFile(fh)
    except BaseException:  # a bad footer or a store that stays unavailable
        fh.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            with parquet_errors(source.uri):
                yield from pf.iter_batches(batch_size=batch_size)
        finally:
            fh.close()

    return pf.schema_arrow, batches()


@contextmanager
def parquet_errors(uri: str, what: str = "") -> Iterator[None]:
    """A store that stays unavailable as itself; any other failure (pyarrow raises
    several types for a bad file) as a ValueError naming ``uri`` (after ``what``, e.g.
    ``"--selection "``). Every parquet read of a user's file goes through it."""
    try:
        yield
    except Exception as exc:
        raise_if_unavailable(exc, f"reading {uri!r}")
        raise ValueError(f"cannot read {what}{uri!r} as parquet: {exc}") from None


def _require(schema: pa.Schema, names: Sequence[str], where: str) -> None:
    for name in names:
        if name not in schema.names:
            raise ValueError(
                f"column {name!r} not found in {where}; available columns: {schema.names}."
            )
    check_unique_columns(schema, names, where)


def check_unique_columns(schema: pa.Schema, names: Sequence[str], where: str) -> None:
    """Refuse a file with two columns of one name among ``names``: which to read is unknown."""
    for name in dict.fromkeys(names):
        count = len(schema.get_all_field_indices(name))
        if count > 1:
            raise ValueError(
                f"column {name!r} occurs {count} times in {where}; rename or drop the extra "
                "ones (datamask cannot tell which to read)."
            )


#: Field metadata of a work file's embedding column stored as raw float32 rows (a
#: ``fixed_size_binary`` of 4 x width bytes; :func:`pack_features`). Parquet writes a
#: fixed-size list with a repetition level per number: a 10k x 384 shard took 0.12 s to
#: write and 0.05 s to read that way, 0.02 s and 0.005 s as raw rows.
PACKED_FEATURES = b"datamask:float32-rows"


def pack_features(table: pa.Table, name: str, feats: np.ndarray) -> pa.Table:
    """``table`` with its embedding column ``name`` replaced by ``feats`` (float32, the
    column already checked by :func:`features_from_arrow`) as raw rows, marked with
    :data:`PACKED_FEATURES`: what the work dir's row copies hold."""
    rows = np.ascontiguousarray(feats, dtype=np.float32)
    n, width = rows.shape
    packed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(4 * width), n, [None, pa.py_buffer(rows.tobytes())]
    )
    field = pa.field(name, packed.type, nullable=False, metadata={PACKED_FEATURES: b"1"})
    return table.set_column(table.schema.get_field_index(name), field, packed)


def _unpacked(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The float32 (n, d) rows of a :func:`pack_features` column."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = arr.type.byte_width // 4
    data = arr.buffers()[1]
    start = arr.offset * arr.type.byte_width
    flat = np.frombuffer(data, dtype=np.float32, count=len(arr) * width, offset=start)
    return flat.reshape(len(arr), width).copy()


def feature_width(field: pa.Field) -> int | None:
    """The embedding width a column's type fixes (a fixed-size list, or packed rows);
    None for a variable-length list."""
    if field.metadata and PACKED_FEATURES in field.metadata:
        return field.type.byte_width // 4
    if pa.types.is_fixed_size_list(field.type):
        return int(field.type.list_size)
    return None


def features_from_arrow(
    column: pa.ChunkedArray | pa.Array, where: str, name: str = "feature_arr"
) -> np.ndarray:
    """An embedding column (list, large_list or fixed_size_list of numbers) as float32 (n, d).

    Raises a ValueError naming the first row whose width differs, or the first null row.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    typ = arr.type
    if not (
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    ):
        raise ValueError(f"column {name!r} in {where} must be a list of floats; got {typ}.")
    if arr.null_count:
        first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"column {name!r} has {arr.null_count} null embeddings "
            f"(first at row {first} of {where}); drop them before selecting."
        )
    if pa.types.is_fixed_size_list(typ):
        width = typ.list_size
    else:
        lengths = np.diff(arr.offsets.to_numpy())
        width = int(lengths[0]) if n else 0
        bad = np.flatnonzero(lengths != width)
        if len(bad):
            raise ValueError(
                f"embedding width {int(lengths[bad[0]])} at row {int(bad[0])} of {where} does "
                f"not match width {width} at row 0; every embedding must have the same width."
            )
    values = arr.flatten()
    if values.null_count:
        raise ValueError(f"column {name!r} in {where} has null values inside embeddings.")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"column {name!r} in {where} must hold numbers; got {values.type}.")
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused just below
        flat = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    feats = flat.reshape(n, width) if n else np.zeros((0, width), np.float32)
    # A NaN or inf makes its row's sum non-finite; a sum that overflowed float32 is checked
    # value by value (one float per row, not a boolean per value: 0.1 s against 1 s at 1M)
    with np.errstate(over="ignore", invalid="ignore"):
        suspect = np.flatnonzero(~np.isfinite(feats.sum(axis=1)))
    bad = suspect[~np.isfinite(feats[suspect]).all(axis=1)]
    if len(bad):
        raise ValueError(
            f"features have {len(bad)} rows with NaN/inf values (first at row {int(bad[0])} "
            f"of {where}, column {name!r}; float32 holds up to 3.4e38); drop or fix them "
            "before selecting."
        )
    return feats


def features_column(features: np.ndarray) -> pa.FixedSizeListArray:
    """Rows of a float matrix as one fixed-size-list column of float32: how a run's own
    work files (candidates, kept rows, KEPT's rows) hold unit embeddings."""
    feats = np.ascontiguousarray(features, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), feats.shape[1])


def features_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column :func:`features_column` wrote, as an ``(n, d)`` float32 array (over the
    column's memory: read-only)."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return col.flatten().to_numpy().reshape(len(col), col.type.list_size)


def check_id_type(typ: pa.DataType, id_col: str, where: str) -> None:
    """Ids must be integers or strings (bytes): what sorts, hashes and round-trips."""
    ok = (
        pa.types.is_integer(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )
    if pa.types.is_dictionary(typ):  # dictionary-encoded ids: their values are the ids
        check_id_type(typ.value_type, id_col, where)
        return
    if not ok:
        raise ValueError(f"column {id_col!r} in {where} must hold integers or strings; got {typ}.")


def arrays_from_table(
    table: pa.Table, where: str, columns: Columns
) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Ids (arrow, unchanged), quality (float64, (n, n_scores)) and features (float32) of
    the resolved ``columns``.

    Checks nulls and types; ``where`` names the file (and rows) in every message.
    """
    id_col, quality_cols, feature_col = columns.id_col, columns.quality_cols, columns.feature_col
    check_unique_columns(table.schema, [id_col, *quality_cols, feature_col], where)
    ids_col = table.column(id_col)
    check_id_type(ids_col.type, id_col, where)
    if pa.types.is_dictionary(ids_col.type):  # decoded: ids are written back as values
        ids_col = ids_col.cast(ids_col.type.value_type)
    if pa.types.is_string(ids_col.type) or pa.types.is_large_string(ids_col.type):
        ids_col = text_array(
            ids_col, id_col, where
        )  # invalid UTF-8 named by row, not a codec error
    if ids_col.null_count:
        first = int(np.flatnonzero(ids_col.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"column {id_col!r} has {ids_col.null_count} null ids (first at row {first} of "
            f"{where}); every document needs an id: drop or fill them before selecting."
        )
    quality = []
    for name in quality_cols:
        col = table.column(name)
        if pa.types.is_decimal(col.type) or pa.types.is_dictionary(col.type):
            try:  # decimal scores (and dictionary-encoded numbers) are numbers too
                col = col.cast(pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ValueError(
                    f"column {name!r} in {where} must be numeric; got {col.type}."
                ) from None
        if not (
            pa.types.is_floating(col.type)
            or pa.types.is_integer(col.type)
            or pa.types.is_boolean(col.type)
        ):
            raise ValueError(f"column {name!r} in {where} must be numeric; got {col.type}.")
        quality.append(col.to_numpy(zero_copy_only=False).astype(np.float64))
        check_finite_quality(quality[-1][:, None], [name], where)
    field = table.schema.field(feature_col)
    if field.metadata and PACKED_FEATURES in field.metadata:  # a work file: checked before
        features = _unpacked(table.column(feature_col))
    else:
        features = features_from_arrow(table.column(feature_col), where, feature_col)
    ids = ids_col.combine_chunks() if isinstance(ids_col, pa.ChunkedArray) else ids_col
    q = np.stack(quality, axis=1) if quality else np.zeros((table.num_rows, 0))
    return ids, q, features


def corpus_from_tables(
    tables: Sequence[tuple[pa.Table, str]],
    columns: Columns,
    *,
    source: str,
    quality_range: tuple[Sequence[float], Sequence[float]] | None = None,
    extra_cols: Sequence[str] = (),
) -> tuple[Corpus, pa.Array]:
    """One :class:`~datamask.data.Corpus` from pieces read from one or several files.

    The one place a corpus is built from arrow tables: :func:`read_corpus` (one parquet
    file), :func:`datamask.io.datasets.read_input_corpus` (a ``save_to_disk`` folder) and
    the sharded runner's groups all call it.

    Parameters
    ----------
    tables : sequence of (pyarrow.Table, str)
        Each piece and where it came from (for error messages).
    columns : Columns
        The id, quality and embedding columns, resolved.
    source : str
        The corpus's ``source`` (e.g. ``"group 7"``).
    quality_range : (lows, highs), optional
        Corpus-wide range of each quality column, to scale these rows with.
    extra_cols : sequence of str, default=()
        Columns every piece has, kept in :attr:`~datamask.data.Corpus.extra`.

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
        ids, q, feats = arrays_from_table(table, where, columns)
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
            f"column {columns.id_col!r} has different types across the shards of {source}: "
            f"{sorted(map(str, types))}; store ids with one type."
        )
    ids_arrow = pa.concat_arrays(id_parts) if len(id_parts) > 1 else id_parts[0]
    features = f_parts[0] if len(f_parts) == 1 else np.concatenate(f_parts)
    del f_parts
    extra = {}
    for c in extra_cols:
        parts = [
            _checked(t.column(c), c, where).to_numpy(zero_copy_only=False) for t, where in tables
        ]
        extra[c] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    corpus = Corpus(
        ids=ids_arrow.to_numpy(zero_copy_only=False),
        quality=np.concatenate(q_parts),
        features=features,
        quality_names=list(columns.quality_cols),
        quality_weights=None if (w := columns.quality_weights) is None else np.asarray(w, float),
        source=source,
        id_name=columns.id_col,
        extra=extra,
        quality_range=None
        if quality_range is None
        else (np.asarray(quality_range[0], float), np.asarray(quality_range[1], float)),
    )
    return corpus, ids_arrow


def _checked(col: pa.ChunkedArray, name: str, where: str) -> pa.ChunkedArray | pa.Array:
    """A string column checked as UTF-8 (a parquet reader does not check it), the first bad
    row named; other columns as they are."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return text_array(col, name, where)
    return col


def corpus_from_table(
    table: pa.Table, where: str, columns: Columns, *, extra_cols: Sequence[str] = ()
) -> Corpus:
    """One whole input read as a table (a parquet file, a save_to_disk folder) as a
    :class:`~datamask.data.Corpus`; an input with no rows is refused, naming ``where``."""
    if table.num_rows == 0:
        raise ValueError(f"{where} has no rows.")
    corpus, _ = corpus_from_tables([(table, where)], columns, source=where, extra_cols=extra_cols)
    return corpus


def read_corpus(
    path: str | Path,
    columns: Columns | None = None,
    *,
    extra_cols: Sequence[str] = (),
    expected_dim: int | None = None,
) -> Corpus:
    """Read one parquet file into a :class:`~datamask.data.Corpus` (not yet validated).

    Parameters
    ----------
    path : str or Path
        A parquet file.
    columns : Columns, optional
        The id, quality and embedding columns (list or fixed-size list of floats, any
        width); names not given are resolved against the file's schema
        (:meth:`~datamask.columns.Columns.resolve`). Default: all of them.
    extra_cols : sequence of str
        Optional columns kept for reports when present (e.g. ``n_chars``, ``text``).
    expected_dim : int, optional
        Refuse embeddings of another width (used when reading many shards).
    """
    where = str(path)
    pf = open_parquet(path)
    schema = pf.schema_arrow
    columns = (columns or Columns()).resolve(schema.names, where=where)
    wanted = [columns.id_col, *columns.quality_cols, columns.feature_col]
    _require(schema, wanted, where)
    extras = [c for c in extra_cols if c in schema.names and c not in wanted]
    with parquet_errors(where):
        table = read_in_parallel(path, pf, wanted + extras)
    corpus = corpus_from_table(table, where, columns, extra_cols=extras)
    if expected_dim is not None and corpus.dim != expected_dim:
        raise ValueError(f"embedding width {corpus.dim} in {where} does not match {expected_dim}.")
    return corpus


def read_in_parallel(
    path: str | Path | Location,
    pf: pq.ParquetFile,
    columns: Sequence[str],
    threads: int | None = None,
) -> pa.Table:
    """``columns`` of every row group of ``pf`` (the file at ``path``), by up to
    ``threads`` threads (default: pyarrow's CPU count), each reading its contiguous share
    of the row groups through a handle of its own; the same table as ``pf.read``.

    pyarrow decodes a column chunk in one thread, and an embedding column (a list of
    floats, its levels decoded value by value) is most of a file: a 1M x 384 file (200
    row groups) read in 4.4-5.2 s whole and 2.2-3.9 s in two shares on 2 cores.
    """
    n_groups = pf.num_row_groups
    workers = min(threads or pa.cpu_count(), n_groups)
    if workers < 2:
        return pf.read(columns=list(columns))
    rows = np.cumsum([pf.metadata.row_group(i).num_rows for i in range(n_groups)])
    cuts = np.searchsorted(rows, np.arange(1, workers) * rows[-1] / workers, side="right")
    shares = [s.tolist() for s in np.split(np.arange(n_groups), cuts) if len(s)]

    def read(share: list[int]) -> pa.Table:
        return open_parquet(path).read_row_groups(share, columns=list(columns), use_threads=False)

    with ThreadPoolExecutor(len(shares), thread_name_prefix="datamask-read") as pool:
        return pa.concat_tables(pool.map(read, shares))


#: Compression of the work dir's row copies (the spills, the group objects): lz4 writes a
#: 10k x 384 shard in 0.05 s against zstd's 0.12 s and reads it in half the time, for 9%
#: more bytes (embeddings are float noise to a compressor); outputs stay zstd.
WORK_COMPRESSION = "lz4"


def atomic_write_table(table: pa.Table, path: str | Path | Location) -> None:
    """Write ``table`` as zstd parquet to ``path`` atomically (see :mod:`datamask.io.atomic`)."""
    with atomic_write(storage_path(path)) as tmp:
        _write_output(table, tmp)


def _write_output(table: pa.Table, where: Any) -> None:
    """``table`` as the parquet of an output (zstd, page checksums, floats without a
    dictionary: :mod:`.dictionary`) to ``where``, a path or file."""
    pq.write_table(
        table,
        where,
        compression="zstd",
        write_page_checksum=True,
        use_dictionary=dictionary_columns(table.schema),
    )


#: Key of the selection summary (JSON) in the output parquet's schema metadata.
SUMMARY_KEY = b"datamask.summary"


def summary_path(output: str | Path) -> Path:
    """Where the JSON summary of a selection lands: beside it, ``<stem>.summary.json``."""
    out = Path(output)
    return out.with_name(out.name.removesuffix(".parquet") + ".summary.json")


def write_selection(
    path: str | Path, table: pa.Table, summary: dict[str, Any] | None = None
) -> None:
    """Write a selection table and its summary as one unit (the table from
    :func:`datamask.pipeline.selection_table`).

    The summary, stamped with a fresh ``run_id``, is stored inside the parquet's schema
    metadata (``datamask.summary``), so the parquet always carries the settings that made
    it; ``<stem>.summary.json`` beside it is a readable copy. Both are published by
    :func:`~datamask.io.atomic.atomic_write_group`: both files are written and synced under
    temporary names; then the old summary is removed, the parquet renamed into place, then
    the summary. A crash or full disk at any point leaves either
    the old pair, or a parquet with no summary file beside it, never a parquet next to
    another run's summary. :func:`read_summary` reads the authoritative copy.
    """
    if summary is None:
        atomic_write_table(table, path)
        return
    path = Path(path)
    text = to_json({**summary, "run_id": secrets.token_hex(8)})
    meta = {**(table.schema.metadata or {}), SUMMARY_KEY: text.encode()}
    table = table.replace_schema_metadata(meta)
    with atomic_write_group([path, summary_path(path)]) as (tmp_table, tmp_json):
        _write_output(table, tmp_table)
        tmp_json.write_text(text, encoding="utf-8")


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """The summary stored inside a selection parquet by :func:`write_selection`, or None."""
    meta = open_parquet(path).schema_arrow.metadata or {}
    text = meta.get(SUMMARY_KEY)
    return None if text is None else json.loads(text)
