"""Stream documents from parquet and JSON-lines files, a chunk of rows at a time.

Used by ``datamask embed``: memory holds one chunk, whatever the corpus size. Inputs are a
file, a folder (every ``.parquet``, ``.jsonl``, ``.jsonl.gz``, ``.json`` and ``.json.gz``
below it, skipping names that start with ``.`` or ``_``), a glob, or a list of files, read
in sorted order.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .retry import raise_if_unavailable

__all__ = [
    "TEXT_SUFFIXES",
    "TextChunk",
    "file_kind",
    "list_text_files",
    "iter_text_chunks",
    "footer_rows",
    "is_text_type",
    "lengths_from_arrow",
    "raise_nulls",
    "text_array",
]

#: File endings read as documents.
TEXT_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".json.gz")


def file_kind(path: str | Path, what: str = "input") -> str:
    """``"parquet"`` or ``"jsonl"`` from the file's name (``.gz`` allowed for JSON)."""
    name = Path(path).name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "jsonl"
    suffix = "".join(Path(path).suffixes[-2:]) if name.endswith(".gz") else Path(path).suffix
    raise ValueError(
        f"{what} file {Path(path).name!r} must end in .parquet, .jsonl or .json (optionally "
        f".gz for JSON); got {suffix!r}."
    )


def list_text_files(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The files of ``source`` (a file, folder, glob or list), sorted.

    Raises
    ------
    FileNotFoundError
        When a named file or folder does not exist.
    ValueError
        When a folder or glob holds no readable file.
    """
    if isinstance(source, list | tuple):
        files = [Path(s) for s in source]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"input file {str(f)!r} does not exist.")
        return sorted(files, key=str)
    text = str(source)
    p = Path(text)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [
            f
            for f in p.rglob("*")
            if f.is_file()
            and f.name.lower().endswith(TEXT_SUFFIXES)
            and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)
        ]
        if not files:
            raise ValueError(f"directory {text!r} holds no {', '.join(TEXT_SUFFIXES)} files.")
        return sorted(files, key=str)
    if glob.has_magic(text):
        files = [Path(f) for f in glob.glob(text, recursive=True) if Path(f).is_file()]
        if not files:
            raise ValueError(f"no files match {text!r}.")
        return sorted(files, key=str)
    raise FileNotFoundError(f"input file {text!r} does not exist.")


@dataclass(frozen=True)
class TextChunk:
    """Rows ``[start, start + table.num_rows)`` of ``path``."""

    table: pa.Table
    path: Path
    start: int


def _open_binary(path: Path) -> io.BufferedIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {lineno}, column "
            f"{exc.start + 1} cannot be decoded; re-encode the file as UTF-8."
        ) from None


def _json_records(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Each object of a JSON-lines file with where it is; a top-level JSON array also works
    (it is read whole: JSON arrays cannot be streamed line by line)."""
    try:
        with _open_binary(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = _decode(raw, path, lineno)
                if lineno == 1 and line.lstrip().startswith("["):
                    rest = fh.read()
                    text = line + _decode(rest, path, 2) if rest else line
                    try:
                        items = json.loads(text)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path.name} is not valid JSON: {exc}") from None
                    for i, item in enumerate(items):
                        yield item, f"item {i}"
                    return
                if not line.strip():
                    continue
                try:
                    yield json.loads(line), f"line {lineno}"
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{path.name} line {lineno} is not valid JSON: {exc}"
                    ) from None
    except (OSError, EOFError) as exc:  # a truncated or corrupt .gz
        raise ValueError(f"cannot read {str(path)!r}: {exc}") from None


def _records_table(records: list[dict[str, Any]], path: Path) -> pa.Table:
    columns: dict[str, list[Any]] = {}
    for row in records:  # union of keys, in order of first appearance
        for key in row:
            columns.setdefault(key, [])
    for key, values in columns.items():
        values.extend(row.get(key) for row in records)
    try:
        return pa.table({key: pa.array(values) for key, values in columns.items()})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(
            f"{path.name} could not be turned into a table (mixed types in a column?): {exc}"
        ) from None


def _jsonl_chunks(path: Path, chunk_rows: int) -> Iterator[TextChunk]:
    records: list[dict[str, Any]] = []
    start = 0
    for rec, where in _json_records(path):
        if not isinstance(rec, dict):
            raise ValueError(
                f"{path.name} {where} is a JSON {type(rec).__name__}, not an object; "
                'each record must be an object such as {"text": ...}.'
            )
        records.append(rec)
        if len(records) == chunk_rows:
            yield TextChunk(_records_table(records, path), path, start)
            start += len(records)
            records = []
    if records:
        yield TextChunk(_records_table(records, path), path, start)


def _parquet_chunks(path: Path, chunk_rows: int) -> Iterator[TextChunk]:
    try:
        pf = pq.ParquetFile(path)
        start = 0
        for batch in pf.iter_batches(batch_size=chunk_rows):
            yield TextChunk(pa.Table.from_batches([batch]), path, start)
            start += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise_if_unavailable(exc, f"reading {path.name!r}")
        raise ValueError(f"{path.name} could not be read as parquet: {exc}") from None


def iter_text_chunks(files: Sequence[Path], chunk_rows: int = 4096) -> Iterator[TextChunk]:
    """Stream ``files`` in chunks of at most ``chunk_rows`` rows (a chunk never spans files).

    Raises
    ------
    ValueError
        Naming the file (and line) that cannot be parsed.
    """
    for f in files:
        if file_kind(f) == "parquet":
            yield from _parquet_chunks(f, chunk_rows)
        else:
            yield from _jsonl_chunks(f, chunk_rows)


def footer_rows(files: Sequence[Path], column: str) -> int | None:
    """Rows of ``files`` from the parquet footers alone, or None when one is not parquet.

    Every parquet file with rows must have ``column`` (checked from its footer, before
    anything is read): the message names the file and lists its columns.
    """
    kinds = [file_kind(f) for f in files]  # every file's type is checked before any is read
    total: int | None = 0
    for f, kind in zip(files, kinds, strict=True):
        if kind != "parquet":
            total = None
            continue
        try:
            meta = pq.ParquetFile(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise_if_unavailable(exc, f"reading {f.name!r}")
            raise ValueError(f"{f.name} could not be read as parquet: {exc}") from None
        names = meta.schema_arrow.names
        if column not in names and meta.metadata.num_rows:
            raise ValueError(
                f"column {column!r} not found in {f.name}; available columns: {names}."
            )
        if total is not None:
            total += meta.metadata.num_rows
    return total


# --- text columns: the one check of what a text (or length) column holds ------------------
def is_text_type(typ: pa.DataType) -> bool:
    """Whether ``typ`` holds text: strings, or bytes (read as UTF-8, checked row by row)."""
    return (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def raise_nulls(name: str, col: str, arr: Any, start: int = 0) -> None:
    """Refuse the nulls of ``arr``, naming the column, the file and the first row."""
    mask = arr.is_null()
    mask = mask.combine_chunks() if hasattr(mask, "combine_chunks") else mask
    flags = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
    first = int(np.flatnonzero(flags)[0]) + start
    raise ValueError(
        f"column {col!r} in {name} has {int(flags.sum())} null value(s) (first at row {first}); "
        "drop or fill them first."
    )


def text_array(
    arr: pa.Array | pa.ChunkedArray, column: str, where: str, first_row: int = 0
) -> pa.Array | pa.ChunkedArray:
    """``arr`` as strings, or a ValueError naming the column, the file and the row.

    Strings pass as they are; bytes are decoded as UTF-8 (the first row that is not valid
    UTF-8 is named, with its byte); an all-null column is strings that are all null; any
    other type (numbers, lists, structs) is refused with its type. Nulls are the caller's
    to refuse (:func:`raise_nulls`) or to read as empty.
    """
    typ = arr.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        try:  # a parquet string column is not checked on read: invalid UTF-8 gets this far
            arr.validate(full=True)
            return arr
        except pa.ArrowInvalid:
            binary = pa.large_binary() if pa.types.is_large_string(typ) else pa.binary()
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            arr = arr.view(binary)  # the bytes, so the first bad row is found below
    elif pa.types.is_null(typ):
        return arr.cast(pa.string())
    elif not is_text_type(typ):
        raise ValueError(
            f"column {column!r} in {where} holds {typ}, not text (strings); give the column "
            "of the documents' text (--text-col)."
        )
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    for i, raw in enumerate(arr.to_pylist()):
        try:
            if raw is not None:
                raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"column {column!r} in {where} is not UTF-8 text at row {first_row + i}: byte "
                f"0x{raw[exc.start]:02x} at offset {exc.start} cannot be decoded; re-encode "
                "it as UTF-8."
            ) from None
    raise ValueError(f"column {column!r} in {where} cannot be read as text.")  # not reached


def lengths_from_arrow(
    arr: pa.Array | pa.ChunkedArray, column: str, where: str, first_row: int = 0
) -> np.ndarray:
    """Document lengths from a length column: numbers as they are, texts by their length
    in characters (null: 0); any other type is refused naming the column and the file."""
    typ = arr.type
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
    if not (is_text_type(typ) or pa.types.is_null(typ)):
        raise ValueError(
            f"length column {column!r} in {where} holds {typ}: neither numbers nor text; "
            "give a column of lengths or texts (--length-col)."
        )
    counts = pc.utf8_length(text_array(arr, column, where, first_row)).fill_null(0)
    return np.asarray(counts.to_numpy(zero_copy_only=False), dtype=np.float64)
