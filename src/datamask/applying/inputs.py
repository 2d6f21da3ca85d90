"""Reading apply's input shards: which files are input, their format, their rows as JSON
lines and their ids batch by batch (only the id column is decoded)."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..io.fs import Location
from ..io.listing import expand, glob_root
from ..io.parquet import parquet_errors

SHARD_SUFFIXES = (".parquet", ".pq", ".jsonl", ".jsonl.gz")  # any letter case


def _format(name: str) -> str:
    lower = name.lower()
    for suffix, fmt in ((".jsonl.gz", "jsonl.gz"), (".jsonl", "jsonl"), (".parquet", "parquet")):
        if lower.endswith(suffix):
            return fmt
    if lower.endswith(".pq"):
        return "parquet"
    raise ValueError(f"input shard {name!r} must end in .parquet, .pq, .jsonl or .jsonl.gz.")


def _input_shards(src: Location, sel: Location) -> list[Location]:
    """The input's shards, less what is no input: the selection (and its keep lists) when
    it lies inside the input folder, and files under ``_``/``.`` folders (work dirs,
    apply state), as ``select`` skips them."""
    shards = expand(src, what="--input", suffixes=SHARD_SUFFIXES)
    root = glob_root(src).rstrip("/")
    sel_path = sel.path.rstrip("/")
    skip = (sel_path, sel_path.removesuffix(".parquet") + ".keep", sel_path + ".keep")
    kept = []
    for s in shards:
        if any(s.path == p or s.path.startswith(p + "/") for p in skip):
            continue
        rel = s.path[len(root) + 1 :] if s.path.startswith(root + "/") else s.path
        if any(part.startswith(("_", ".")) for part in rel.split("/")[:-1]):
            continue
        kept.append(s)
    if not kept:
        raise ValueError(
            f"--input {src.uri!r} holds no input shards besides the selection itself; give "
            "the folder the selection was made from."
        )
    return kept


def _json_lines(loc: Location, gz: bool, batch_size: int) -> Iterator[list[bytes]]:
    """Non-empty lines (bytes, newline stripped) in lists of ``batch_size``.

    A gzip file cut short or corrupt raises a ValueError naming it (the shard's output,
    written to a temporary, is then never put in place)."""
    try:
        yield from _json_line_batches(loc, gz, batch_size)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(
            f"{loc.uri} is not a complete gzip file ({exc}); it was cut short or is "
            "corrupt. Restore it, or move it out of --input."
        ) from None


def _json_line_batches(loc: Location, gz: bool, batch_size: int) -> Iterator[list[bytes]]:
    with loc.open_input_stream() as raw:
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        reader = io.BufferedReader(stream, buffer_size=1 << 20) if gz else stream
        chunk: list[bytes] = []
        pending = b""
        while True:
            block = reader.read(1 << 22)
            if not block:
                break
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            chunk.extend(line for line in lines if line.strip())
            while len(chunk) >= batch_size:
                yield chunk[:batch_size]
                chunk = chunk[batch_size:]
        if pending.strip():
            chunk.append(pending)
        if chunk:
            yield chunk


def _ids_of_lines(lines: list[bytes], id_col: str, where: str, first_row: int) -> pa.Array:
    values = []
    for i, line in enumerate(lines):
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as exc:  # before ValueError: it is one
            raise ValueError(
                f"row {first_row + i} of {where} is not UTF-8 text: byte "
                f"0x{line[exc.start]:02x} at offset {exc.start} cannot be decoded; re-encode "
                "the file as UTF-8."
            ) from None
        except ValueError:
            raise ValueError(f"row {first_row + i} of {where} is not valid JSON.") from None
        if not isinstance(obj, dict) or id_col not in obj:
            raise ValueError(
                f"column {id_col!r} not found at row {first_row + i} of {where}; pass the id "
                "column with --id-col."
            )
        values.append(obj[id_col])
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise ValueError(
            f"column {id_col!r} in {where} mixes types; ids must be one type."
        ) from None


def input_names(src: Location, fmt: str) -> list[str]:
    """The column names of one input shard: a parquet's schema, or the keys of a JSON
    lines shard's first row (none for an empty shard)."""
    if fmt == "parquet":
        with src.open_input_file() as fh, parquet_errors(src.uri):
            return list(pq.ParquetFile(fh).schema_arrow.names)
    for lines in _json_lines(src, fmt == "jsonl.gz", 1):
        try:
            row = json.loads(lines[0])
        except ValueError:
            return []  # the row is named as bad where it is read
        return list(row) if isinstance(row, dict) else []
    return []


def _id_batches(src: Location, fmt: str, id_col: str, batch_size: int) -> Iterator[pa.Array]:
    """The id column of one input shard, batch by batch (only that column is decoded)."""
    if fmt == "parquet":
        with src.open_input_file() as fh:
            with parquet_errors(src.uri):
                pf = pq.ParquetFile(fh)
            if id_col not in pf.schema_arrow.names:
                raise ValueError(
                    f"column {id_col!r} not found in {src.uri}; available columns: "
                    f"{pf.schema_arrow.names}; pass the id column with --id-col."
                )
            with parquet_errors(src.uri):
                for batch in pf.iter_batches(batch_size=batch_size, columns=[id_col]):
                    yield batch.column(0)
        return
    n = 0
    for lines in _json_lines(src, fmt == "jsonl.gz", batch_size):
        yield _ids_of_lines(lines, id_col, src.uri, n)
        n += len(lines)
