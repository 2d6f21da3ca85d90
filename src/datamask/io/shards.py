"""Parquet shards: find them, count their rows from the footer, read row ranges.

Nothing here loads a whole corpus. :func:`inspect_shards` reads footers only (row counts,
row-group sizes, schema); :func:`read_rows` reads the row groups that overlap a range of
rows of one file; :func:`scan_shard` streams one file batch by batch. Every error names
the file it is about.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._validation import check_quality_span, unit_rows
from ..columns import Columns
from .fs import Location, open_input, storage_path
from .listing import expand
from .parquet import (
    arrays_from_table,
    check_finite_quality,
    check_id_type,
    corpus_from_tables,
    open_parquet,
    parquet_errors,
)
from .retry import raise_if_unavailable

__all__ = [
    "ShardInfo",
    "list_shards",
    "inspect_shards",
    "read_rows",
    "read_ranges",
    "iter_files",
    "corpus_from_tables",
    "ShardScan",
    "ID_HASH_DTYPE",
    "scan_shard",
    "content_checksum",
    "hash_ids",
    "literal_or_glob",
    "map_files",
]

T = TypeVar("T")

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


#: The file name endings of parquet shards in a folder, compared in lower case.
PARQUET_SUFFIXES = (".parquet", ".pq")


def list_shards(source: ShardSource, *, exclude: Sequence[str | Path] = ()) -> list[Path]:
    """The parquet files of ``source``, sorted by path.

    Parameters
    ----------
    source : str, Path, list of paths or pyarrow.dataset.FileSystemDataset
        A parquet file; a directory (every ``*.parquet`` or ``*.pq`` below it, in any
        letter case, recursively, skipping
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
    remote = _remote_shards(source, exclude)
    if remote is not None:
        return remote
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
    if literal_or_glob(text) == "glob":
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
        for f in root.rglob("*")
        if f.suffix.lower() in PARQUET_SUFFIXES  # a.parquet, B.PARQUET, c.pq alike
        and f.is_file()
        and not _hidden(f, root)
        and not _inside(f, skip)
    ]
    if not files:
        raise ValueError(f"directory {text!r} holds no *.parquet (or *.pq) files.")
    return sorted(files, key=str)


def _remote_shards(source: Any, exclude: Sequence[str | Path]) -> list[Any] | None:
    """:func:`list_shards` of an object-storage URI (file, folder or glob) or a list of
    them, as :class:`~datamask.io.fs.Location` s, from listings; None for local input."""
    items = list(source) if isinstance(source, list | tuple) else [source]
    if not items or not all(isinstance(storage_path(str(i)), Location) for i in items):
        return None
    skip = [str(storage_path(str(p))).rstrip("/") + "/" for p in exclude]
    found = []
    for item in items:
        loc = storage_path(str(item))
        for f in expand(loc, what="input", suffixes=PARQUET_SUFFIXES):
            if not any(f.uri.startswith(s) for s in skip):
                found.append(f)
    if not found:
        raise ValueError(f"input {str(source)!r} holds no *.parquet (or *.pq) files.")
    return sorted(found, key=str)


def literal_or_glob(text: str) -> str:
    """``"literal"`` when ``text`` names an existing path (even with ``[``, ``*`` or ``?`` in
    it), else ``"glob"`` when it has glob characters, else ``"literal"``."""
    if not glob.has_magic(text) or isinstance(storage_path(text), Location):
        return "literal"
    if Path(text).exists():
        return "literal"
    return "glob"


def _open(path: str | Path | Location) -> pq.ParquetFile:
    return open_parquet(path, "input shard")


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
    return map_files(lambda f: _inspect_one(f, columns), files)


def _inspect_one(f: str | Path, columns: Sequence[str]) -> ShardInfo:
    pf = _open(f)
    names = pf.schema_arrow.names
    for name in columns:
        if name not in names:
            raise ValueError(f"column {name!r} not found in {str(f)}; available columns: {names}.")
    meta = pf.metadata
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    place = storage_path(f)
    size = place.info().size if isinstance(place, Location) else os.path.getsize(place)
    return ShardInfo(str(f), int(meta.num_rows), rows, int(size))


#: Requests in flight when the driver reads the footers of remote shards.
FOOTER_THREADS = 16


def map_files(fn: Callable[[Any], T], files: Sequence[Any]) -> list[T]:
    """``[fn(f) for f in files]``, in order; on object storage ``FOOTER_THREADS`` at a
    time (each a few round trips that release the GIL), so the driver's O(S) footer reads
    take S / 16 round trips, not S. The first failing file in order raises, as in a loop."""
    return list(iter_files(fn, files))


def iter_files(fn: Callable[[Any], T], files: Sequence[Any]) -> Iterator[T]:
    """:func:`map_files` as an iterator: ``fn(f)`` for every file, yielded in order, with
    at most ``FOOTER_THREADS`` calls running or done ahead of the one yielded (on object
    storage; one at a time on a local disk), so a caller that streams the results holds
    ``FOOTER_THREADS`` of them at most, never all."""
    if len(files) < 2 or not isinstance(storage_path(files[0]), Location):
        yield from (fn(f) for f in files)
        return
    with ThreadPoolExecutor(min(FOOTER_THREADS, len(files))) as pool:
        ahead: deque[Future[T]] = deque()
        for f in files:
            ahead.append(pool.submit(fn, f))
            if len(ahead) >= FOOTER_THREADS:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


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
    return read_ranges(path, [(start, stop)], columns, row_group_rows=row_group_rows)[0]


def read_ranges(
    path: str | Path,
    ranges: Sequence[tuple[int, int]],
    columns: Sequence[str],
    *,
    row_group_rows: Sequence[int] | None = None,
) -> list[pa.Table]:
    """:func:`read_rows` of several row ranges of one file, which is opened once (one
    footer read, however many ranges) and read once: the row groups any range touches, in
    one call, each range a slice of them. A gather step reads many groups' rows from each
    spill this way (a spill's row groups hold many leaves each: reading each range on its
    own would decode a shared row group once per range). Returns one table per range, in
    the order given."""
    pf = _open(path)
    try:
        if row_group_rows is None:
            meta = pf.metadata
            row_group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(row_group_rows, dtype=np.int64)])
        spans = [_row_groups_of(start, stop, starts, path) for start, stop in ranges]
        wanted = sorted({g for first, last in spans for g in range(first, last)})
        if not wanted:
            empty = pf.schema_arrow.empty_table().select(list(columns))
            return [empty for _ in ranges]
        table = pf.read_row_groups(wanted, columns=list(columns))
    except ValueError:
        raise
    except Exception as exc:  # decompression and decoding errors of a corrupt page
        raise_if_unavailable(exc, f"reading {str(path)!r}")
        raise ValueError(f"cannot read {str(path)!r} as parquet: {exc}") from None
    # where each row group read begins in ``table`` (a range's row groups are consecutive)
    sizes = np.asarray(row_group_rows, dtype=np.int64)[wanted]
    at = dict(zip(wanted, np.concatenate([[0], np.cumsum(sizes)]).tolist(), strict=False))
    return [
        table.slice(at[first] + start - int(starts[first]), stop - start)
        if stop > start
        else table.slice(0, 0)
        for (start, stop), (first, _) in zip(ranges, spans, strict=True)
    ]


def _row_groups_of(start: int, stop: int, starts: np.ndarray, path: str | Path) -> tuple[int, int]:
    """The row groups ``[first, last)`` that rows ``[start, stop)`` lie in (``starts``: the
    row groups' first rows, then the row count); ``(0, 0)`` for no rows."""
    if not 0 <= start <= stop <= starts[-1]:
        raise ValueError(
            f"rows [{start}, {stop}) are out of range for {str(path)!r} "
            f"({int(starts[-1])} rows); was the shard rewritten during the run?"
        )
    if start == stop:
        return 0, 0
    first = int(np.searchsorted(starts, start, side="right") - 1)
    return first, int(np.searchsorted(starts, stop, side="left"))  # last: exclusive


# --- validation pass --------------------------------------------------------------------------
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def hash_ids(ids: pa.Array) -> np.ndarray:
    """A 64-bit hash of every id (integers or strings), vectorised; equal ids, equal hashes.

    Strings are hashed as the sum of a mixed (byte, position) table plus their length, the
    form of tabulation hashing; collisions are possible (rarely) and callers confirm a
    repeated hash by comparing the ids themselves.
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if pa.types.is_dictionary(ids.type):  # dictionary-encoded ids hash as their values
        ids = ids.dictionary_decode()
    typ = ids.type
    if pa.types.is_integer(typ):
        values = ids.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        return _mix(values + np.uint64(0x9E3779B97F4A7C15))
    if pa.types.is_string(typ) or pa.types.is_binary(typ):
        off_type = np.int32
    elif pa.types.is_large_string(typ) or pa.types.is_large_binary(typ):
        off_type = np.int64
    else:
        raise ValueError(f"cannot hash ids of type {typ}.")
    n = len(ids)
    bufs = ids.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_type)[ids.offset : ids.offset + n + 1].astype(
        np.int64
    )
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    starts = offsets[:-1] - lo
    pos = np.arange(hi - lo, dtype=np.int64) - np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        cells = _mix((data[lo:hi].astype(np.uint64) << np.uint64(32)) + pos.astype(np.uint64))
        cells = np.append(cells, np.uint64(0))
        sums = np.add.reduceat(cells, np.minimum(starts, hi - lo))
        sums[lengths == 0] = 0
        return _mix(sums ^ _mix(lengths.astype(np.uint64) + np.uint64(0x632BE59BD9B4E019)))


def content_checksum(path: str | Path, columns: Sequence[str]) -> str:
    """BLAKE2b of the stored (compressed) bytes of ``columns`` in every row group.

    Exactly what a group reads, taken from the byte ranges the footer gives, so a shard
    rewritten in place with other values (even of the same size) gets another checksum,
    whatever library decodes it.
    """
    pf = _open(path)
    meta = pf.metadata
    schema = meta.schema
    leaves = [
        i for i in range(meta.num_columns) if schema.column(i).path.split(".")[0] in set(columns)
    ]
    h = hashlib.blake2b(digest_size=16)
    h.update(";".join(str(pf.schema_arrow.field(c)) for c in columns).encode())
    with open_input(path) as fh:
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            h.update(f"rg{rg}:{group.num_rows}".encode())
            for i in leaves:
                cc = group.column(i)
                start = cc.data_page_offset
                if cc.has_dictionary_page and cc.dictionary_page_offset is not None:
                    start = min(start, cc.dictionary_page_offset)
                fh.seek(start)
                remaining = cc.total_compressed_size
                while remaining > 0:
                    block = fh.read(min(remaining, 1 << 22))
                    if not block:
                        break
                    h.update(block)
                    remaining -= len(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardScan:
    """What the validation pass learnt about one shard (see :func:`scan_shard`).

    Attributes
    ----------
    index : int
        Position of the shard in the run's sorted list.
    path : str
        The file.
    width : int
        Embedding width.
    id_type : str
        Arrow type of the id column.
    quality_min, quality_max : tuple of float
        Range of each quality column.
    checksum : str
        :func:`content_checksum` of the columns read.
    id_hashes : ndarray or None
        Structured array (``hash`` uint64, ``row`` int64) of every id's hash, sorted by
        bucket (``hash % n_buckets``); None once the driver has filed them.
    bucket_counts : tuple of int
        Ids of this shard in each bucket.
    tokens : dict or None
        Under a token budget: the shard's ``tokens``, ``longest`` and ``shortest``
        document (filled by the sharded check pass); None otherwise.
    """

    index: int
    path: str
    width: int
    id_type: str
    quality_min: tuple[float, ...]
    quality_max: tuple[float, ...]
    checksum: str
    id_hashes: np.ndarray | None
    bucket_counts: tuple[int, ...]
    tokens: dict[str, float] | None = None


ID_HASH_DTYPE = np.dtype([("hash", "<u8"), ("row", "<i8")])


def _bucket_hashes(hashes: list[np.ndarray], n_buckets: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A shard's id hashes (one array per batch) with their rows, sorted by bucket
    (``hash % n_buckets``, stable), and the count in each bucket."""
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    bucket = (h % np.uint64(n_buckets)).astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    table_h = np.empty(len(h), dtype=ID_HASH_DTYPE)
    table_h["hash"] = h[order]
    table_h["row"] = order
    counts = tuple(int(c) for c in np.bincount(bucket, minlength=n_buckets))
    return table_h, counts


def scan_shard(
    index: int,
    path: str,
    columns: Columns,
    n_buckets: int = 1,
    batch_size: int = 65_536,
    extra: Sequence[str] = (),
    visit: Callable[[pa.RecordBatch], None] | None = None,
    fingerprint: Sequence[str] = (),
) -> ShardScan:
    """Check every row of one shard, streaming; a pure step of the validation pass.

    Checks the id type (integers or strings) and nulls, numeric and finite quality,
    embeddings of one width with finite values whose float64 norm is neither 0 nor inf;
    hashes every id (for the uniqueness check across shards) and the stored bytes of the
    columns (for the resume fingerprint). Memory is one batch plus 16 bytes per row for
    the id hashes.

    ``extra``: more columns read in the same pass (not checked); ``visit``: called with
    every batch once it is checked (no second read of the rows); ``fingerprint``: the
    columns the checksum covers (default: the checked ones), the columns the run's
    provenance records (:func:`~datamask.io.provenance.record_inputs`).

    Raises
    ------
    ValueError
        Naming the file and the first bad row.
    """
    id_col, quality_cols = columns.id_col, columns.quality_cols
    names = columns.read
    read = list(dict.fromkeys([*names, *extra]))
    pf = _open(path)
    id_type = pf.schema_arrow.field(id_col).type
    check_id_type(id_type, id_col, str(path))
    width = -1
    qmin = np.full(len(quality_cols), np.inf)
    qmax = np.full(len(quality_cols), -np.inf)
    hashes = []
    row = 0
    batches = pf.iter_batches(batch_size=batch_size, columns=read)
    while True:
        with parquet_errors(str(path)):  # read errors (a corrupt page) name the file
            batch = next(batches, None)
        if batch is None:
            break
        n = batch.num_rows
        whole = row == 0 and n == pf.metadata.num_rows
        where = str(path) if whole else f"{path} (rows {row}-{row + n})"
        ids, quality, feats = arrays_from_table(pa.Table.from_batches([batch]), where, columns)
        check_finite_quality(quality, quality_cols, where)
        if len(quality):
            qmin = np.minimum(qmin, quality.min(axis=0))
            qmax = np.maximum(qmax, quality.max(axis=0))
        if width < 0:
            width = feats.shape[1]
        elif feats.shape[1] != width:
            raise ValueError(
                f"embedding width {feats.shape[1]} in {where} does not match width {width} "
                f"at row 0 of {path}."
            )
        unit_rows(feats, where)
        del feats
        hashes.append(hash_ids(ids))
        if visit is not None:
            visit(batch)
        row += batch.num_rows
    for j, name in enumerate(quality_cols):
        check_quality_span(np.asarray([qmin[j], qmax[j]]), name, str(path))
    table_h, counts = _bucket_hashes(hashes, n_buckets)
    return ShardScan(
        index=index,
        path=str(path),
        width=max(width, 0),
        id_type=str(id_type),
        quality_min=tuple(float(v) for v in qmin),
        quality_max=tuple(float(v) for v in qmax),
        checksum=content_checksum(path, list(fingerprint) or names),
        id_hashes=table_h,
        bucket_counts=counts,
    )
