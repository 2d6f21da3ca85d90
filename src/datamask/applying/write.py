"""Writing one shard: stream the input batch by batch, keep the selected rows, write the
kept (and the removed) rows atomically; the removed ids in the ``ids`` or ``curator`` layout.

One loop, :func:`_apply_shard_file`, serves every input format; what differs between
parquet and JSON lines (how batches are read, how masked rows are written, how a file is
finished) is in :class:`_ParquetShard` and :class:`_JsonLinesShard`."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ..io.dictionary import dictionary_columns
from ..io.fs import Location
from ..io.parquet import parquet_batches
from .inputs import _ids_of_lines, _json_lines
from .plan import _Cover, _KeepList, _Plan


def _check_ids(
    batch_ids: pa.Array, expected: pa.Array | None, where: str, start: int, rows: np.ndarray
) -> None:
    if expected is None or not len(rows):
        return
    got = batch_ids.take(pa.array(rows))
    expected = expected.combine_chunks() if isinstance(expected, pa.ChunkedArray) else expected
    if not got.equals(expected.cast(got.type) if expected.type != got.type else expected):
        bad = next(i for i in range(len(rows)) if got[i] != expected[i])
        raise ValueError(
            f"row {start + int(rows[bad])} of {where} holds id {got[bad].as_py()!r} but the "
            f"selection's keep list says {expected[bad].as_py()!r}; the shard changed since "
            "the selection was made. Select again."
        )


def _curator_row_group(n: int) -> int:
    return max(1000, min(n // 10, 1_000_000))


def _batch_rows(
    plan: _Plan, keep: _KeepList | None, start: int, n: int, ids: Any
) -> tuple[np.ndarray, np.ndarray, Any]:
    """The kept rows of the batch of ``n`` rows at ``start``: their positions, a boolean
    mask, and (keep lists only) the ids the list expects there, else None."""
    if plan.mode == "keep":
        rows, expected = keep.take(start, n)
    else:
        rows, expected = plan.ids.positions(ids), None
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return rows, mask, expected


class _Sink(NamedTuple):
    """One output file of a shard: ``write(batch, mask)`` writes the masked rows;
    ``finish()`` completes the file before it is put in place."""

    write: Callable[[Any, np.ndarray], None]
    finish: Callable[[], None]


class _ParquetShard:
    """A parquet shard: record batches in and out; the dropped rows (``rows`` layout)
    carry their cover, and each kept row's id is checked against the keep list."""

    checks_ids = True

    def __init__(self, src: Location, id_col: str, need_ids: bool, batch_size: int, plan: _Plan):
        self.src, self.id_col = src, id_col
        self.schema, self._batches = parquet_batches(src, batch_size)
        if need_ids and id_col not in self.schema.names:
            raise ValueError(
                f"column {id_col!r} not found in {src.uri}; available columns: "
                f"{self.schema.names}; pass the id column with --id-col."
            )
        self.cover = plan.cover if id_col in self.schema.names else None

    def batches(self) -> Iterator[tuple[pa.RecordBatch, int, Any]]:
        for batch in self._batches:
            ids = batch.column(self.id_col) if self.id_col in self.schema.names else None
            yield batch, batch.num_rows, ids

    def writer(self, stack: ExitStack, loc: Location, removed: bool) -> _Sink:
        schema = self.schema
        cover = self.cover if removed else None
        if cover is not None:  # the dropped rows carry their cover
            for name, col in cover.columns.items():
                if name in schema.names:
                    schema = schema.remove(schema.get_field_index(name))
                schema = schema.append(pa.field(name, col.type))
        writer = pq.ParquetWriter(
            stack.enter_context(loc.open_atomic()),
            schema,
            compression="zstd",
            use_dictionary=dictionary_columns(schema),
        )
        stack.callback(writer.close)  # closed (idempotent) before its file, even on errors
        id_col = self.id_col

        def write(batch: pa.RecordBatch, mask: np.ndarray) -> None:
            rows = batch.filter(pa.array(mask))
            if cover is None:
                writer.write_batch(rows)
                return
            table = pa.Table.from_batches([rows])
            for name, col in cover.columns_for(rows.column(id_col)).items():
                if name in table.column_names:
                    table = table.drop_columns([name])
                table = table.append_column(name, col)
            writer.write_table(table)

        return _Sink(write, writer.close)


class _JsonLinesShard:
    """A JSON lines shard (``.jsonl`` or ``.jsonl.gz``): lines in and out byte for byte;
    ids are parsed only where they are needed (matching by id, removed ids)."""

    checks_ids = False

    def __init__(self, src: Location, id_col: str, need_ids: bool, batch_size: int, gz: bool):
        self.src, self.id_col, self.need_ids = src, id_col, need_ids
        self.batch_size, self.gz = batch_size, gz

    def batches(self) -> Iterator[tuple[list[bytes], int, Any]]:
        n_rows = 0
        for lines in _json_lines(self.src, self.gz, self.batch_size):
            ids = _ids_of_lines(lines, self.id_col, self.src.uri, n_rows) if self.need_ids else None
            yield lines, len(lines), ids
            n_rows += len(lines)

    def writer(self, stack: ExitStack, loc: Location, removed: bool) -> _Sink:
        fh = stack.enter_context(loc.open_atomic())
        if self.gz:
            # mtime=0 and no file name: the same rows give the same bytes on every run.
            fh = gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0)

        def write(lines: list[bytes], mask: np.ndarray) -> None:
            fh.write(b"".join(line + b"\n" for line, m in zip(lines, mask, strict=False) if m))

        # the gzip trailer, before the file is put in place; a plain file needs nothing
        return _Sink(write, fh.close if self.gz else lambda: None)


def _apply_shard_file(
    src: Location,
    out: Location,
    rem: Location | None,
    removed_format: str,
    plan: _Plan,
    keep: _KeepList | None,
    id_col: str,
    batch_size: int,
    bar: tqdm,
    fmt: str = "parquet",
) -> tuple[int, int, list[pa.Array]]:
    """Stream ``src`` (``fmt``: "parquet", "jsonl" or "jsonl.gz") batch by batch into
    ``out`` (the kept rows) and, in the ``rows`` layout, ``rem`` (the dropped rows), both
    in ``src``'s format; returns the rows read, the rows kept, and the dropped ids (for the
    ``ids`` and ``curator`` layouts, written by :func:`_write_removed_ids`)."""
    need_ids = plan.mode == "ids" or removed_format in ("ids", "curator")
    shard: _ParquetShard | _JsonLinesShard = (
        _ParquetShard(src, id_col, need_ids, batch_size, plan)
        if fmt == "parquet"
        else _JsonLinesShard(src, id_col, need_ids, batch_size, gz=fmt == "jsonl.gz")
    )
    n_rows = n_kept = 0
    removed_ids: list[pa.Array] = []
    with ExitStack() as stack:  # on an error neither file is put in place
        kept = shard.writer(stack, out, removed=False)
        dropped = (
            shard.writer(stack, rem, removed=True)
            if rem is not None and removed_format == "rows"
            else None
        )
        for batch, n, ids in shard.batches():
            rows, mask, expected = _batch_rows(plan, keep, n_rows, n, ids)
            if shard.checks_ids and expected is not None and ids is not None:
                _check_ids(ids, expected, src.uri, n_rows, rows)
            kept.write(batch, mask)
            if dropped is not None:
                dropped.write(batch, ~mask)
            elif rem is not None:
                removed_ids.append(ids.filter(pa.array(~mask)))
            n_rows += n
            n_kept += len(rows)
            bar.update(n)
        kept.finish()
        if dropped is not None:
            dropped.finish()
    return n_rows, n_kept, removed_ids


def _write_removed_ids(
    parts: list[pa.Array],
    loc: Location,
    id_col: str,
    removed_format: str,
    id_type: Any,
    cover: _Cover | None = None,
) -> None:
    chunks = [c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], id_type or pa.string())
    if removed_format == "curator":
        ids = ids.take(pc.sort_indices(ids))
        table = pa.table({"id": ids})
        row_group = _curator_row_group(len(ids))
    else:
        table = pa.table({id_col: ids, **(cover.columns_for(ids) if cover is not None else {})})
        row_group = None
    with loc.open_atomic() as fh:
        pq.write_table(
            table,
            fh,
            compression="zstd",
            row_group_size=row_group,
            use_dictionary=dictionary_columns(table.schema),
        )
