"""Writing one shard: stream the input batch by batch, keep the selected rows, write the
kept (and the removed) rows atomically; the removed ids in the ``ids`` or ``curator`` layout."""

from __future__ import annotations

import gzip
from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

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


def _apply_parquet(
    src: Location,
    out: Location,
    rem: Location | None,
    removed_format: str,
    plan: _Plan,
    keep: _KeepList | None,
    id_col: str,
    batch_size: int,
    bar: tqdm,
) -> tuple[int, int, list[pa.Array]]:
    schema, batches = parquet_batches(src, batch_size)
    need_ids = plan.mode == "ids" or removed_format in ("ids", "curator")
    if need_ids and id_col not in schema.names:
        raise ValueError(
            f"column {id_col!r} not found in {src.uri}; available columns: {schema.names}; "
            "pass the id column with --id-col."
        )
    n_rows = n_kept = 0
    removed_ids: list[pa.Array] = []
    with ExitStack() as stack:  # on an error neither file is put in place
        writer = pq.ParquetWriter(
            stack.enter_context(out.open_atomic()), schema, compression="zstd"
        )
        stack.callback(writer.close)  # closed (idempotent) before its file, even on errors
        rem_writer = None
        cover = plan.cover if id_col in schema.names else None
        if rem is not None and removed_format == "rows":
            rem_schema = schema
            if cover is not None:  # the dropped rows carry their cover
                for name, col in cover.columns.items():
                    if name in rem_schema.names:
                        rem_schema = rem_schema.remove(rem_schema.get_field_index(name))
                    rem_schema = rem_schema.append(pa.field(name, col.type))
            rem_writer = pq.ParquetWriter(
                stack.enter_context(rem.open_atomic()), rem_schema, compression="zstd"
            )
            stack.callback(rem_writer.close)
        for batch in batches:
            n = batch.num_rows
            ids = batch.column(id_col) if id_col in schema.names else None
            rows, mask, expected = _batch_rows(plan, keep, n_rows, n, ids)
            if expected is not None and ids is not None:
                _check_ids(ids, expected, src.uri, n_rows, rows)
            writer.write_batch(batch.filter(pa.array(mask)))
            if rem_writer is not None:
                dropped = batch.filter(pa.array(~mask))
                if cover is not None:
                    table = pa.Table.from_batches([dropped])
                    for name, col in cover.columns_for(dropped.column(id_col)).items():
                        if name in table.column_names:
                            table = table.drop_columns([name])
                        table = table.append_column(name, col)
                    rem_writer.write_table(table)
                else:
                    rem_writer.write_batch(dropped)
            elif rem is not None:
                removed_ids.append(ids.filter(pa.array(~mask)))
            n_rows += n
            n_kept += len(rows)
            bar.update(n)
        writer.close()
        if rem_writer is not None:
            rem_writer.close()
    return n_rows, n_kept, removed_ids


def _apply_jsonl(
    src: Location,
    out: Location,
    rem: Location | None,
    removed_format: str,
    plan: _Plan,
    keep: _KeepList | None,
    id_col: str,
    batch_size: int,
    bar: tqdm,
    gz: bool,
) -> tuple[int, int, list[pa.Array]]:
    need_ids = plan.mode == "ids" or removed_format in ("ids", "curator")
    n_rows = n_kept = 0
    removed_ids: list[pa.Array] = []

    def opener(fh: Any) -> Any:
        # mtime=0 and no file name: the same rows give the same bytes on every run.
        return gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) if gz else fh

    rem_rows = rem is not None and removed_format == "rows"
    with ExitStack() as stack:  # on an error neither file is put in place
        w_out = opener(stack.enter_context(out.open_atomic()))
        w_rem = opener(stack.enter_context(rem.open_atomic())) if rem_rows else None
        for lines in _json_lines(src, gz, batch_size):
            n = len(lines)
            ids = _ids_of_lines(lines, id_col, src.uri, n_rows) if need_ids else None
            rows, mask, _ = _batch_rows(plan, keep, n_rows, n, ids)
            w_out.write(b"".join(line + b"\n" for line, m in zip(lines, mask, strict=False) if m))
            if w_rem is not None:
                w_rem.write(
                    b"".join(line + b"\n" for line, m in zip(lines, mask, strict=False) if not m)
                )
            elif rem is not None:
                removed_ids.append(ids.filter(pa.array(~mask)))
            n_rows += n
            n_kept += len(rows)
            bar.update(n)
        if gz:  # the gzip trailers, before the files are put in place
            w_out.close()
            if w_rem is not None:
                w_rem.close()
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
        pq.write_table(table, fh, compression="zstd", row_group_size=row_group)
