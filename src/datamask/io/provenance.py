"""What a selection was made from, and the check that an input is that (``docs/provenance.md``).

``datamask select`` records, in its summary (one file) or ``manifest.json`` (shards), a
``provenance`` block: the id column and its Arrow type, the columns it read, and per input
file its name (relative to the input, as the keep lists name it), absolute path, row
count, size, modification time and content checksum. The checksum is the resume logic's
:func:`~datamask.io.shards.content_checksum` (BLAKE2b of the stored bytes of the columns
read); a sharded run passes the checksums its validation pass already computed.

:func:`verify_inputs` is what ``apply``, ``evaluate`` and ``report`` run before writing anything. An
input parquet is *the* recorded file when its size matches and either it is the same path
with the same modification time (the stat shortcut ``make`` and ``rsync`` use: no bytes
are read) or its checksum is equal. A parquet input that holds every recorded column but
matches no recorded file, or one named like a recorded file whose content differs, is
refused; ``.jsonl``/``.jsonl.gz`` inputs and parquet inputs without the recorded columns
(the texts an embedded corpus was made from) cannot be fingerprinted and are checked by
their ids instead.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .datasets import input_files
from .fs import Location, open_input, resolve, storage_path
from .keep import input_names
from .parquet import read_summary
from .shards import content_checksum, map_files

__all__ = [
    "PROVENANCE_FORMAT",
    "TRUST_FLAG",
    "id_kind",
    "record_inputs",
    "selection_record",
    "verify_inputs",
    "verify_selection_file",
    "warn_trust_unused",
]

PROVENANCE_FORMAT = "datamask.provenance/1"
#: The escape hatch, named in every refusal (``apply`` and ``evaluate`` take it).
TRUST_FLAG = "--trust-selection"


def id_kind(typ: pa.DataType | str) -> str:
    """``"integer"``, ``"string"`` or the type's name: what ids compare equal within."""
    if isinstance(typ, str):
        typ_s = typ
        if typ_s.startswith(("int", "uint")):
            return "integer"
        if typ_s in ("string", "large_string", "utf8", "large_utf8", "string_view"):
            return "string"
        return typ_s
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_integer(typ):
        return "integer"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return "string"
    return str(typ)


def _file_record(path: str, columns: Sequence[str], checksum: str | None) -> dict[str, Any]:
    place = storage_path(path)
    if isinstance(place, Location):  # an object: its URI, size and modification time
        info = place.info()
        size, mtime_ns, where = info.size, info.mtime_ns, place.uri
    else:
        st = os.stat(place)
        size, mtime_ns, where = st.st_size, st.st_mtime_ns, str(place)
    with open_input(place) as fh:
        num_rows = pq.ParquetFile(fh).metadata.num_rows
    return {
        "path": where,
        "num_rows": num_rows,
        "size_bytes": size,
        "mtime_ns": mtime_ns,
        "checksum": checksum if checksum is not None else content_checksum(path, columns),
    }


def record_inputs(
    paths: Sequence[str | Path],
    names: Sequence[str],
    columns: Sequence[str],
    *,
    id_col: str,
    checksums: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``provenance`` block of a selection made from the local parquet ``paths``.

    Parameters
    ----------
    paths : sequence of path
        The input files, in the run's order.
    names : sequence of str
        Their names relative to the input (:func:`datamask.io.keep.relative_names`).
    columns : sequence of str
        The columns the selection read (what the checksum covers).
    id_col : str
        The id column (its stored type is recorded too).
    checksums : dict, optional
        ``{path: content_checksum}`` already computed (the sharded validation pass); the
        others are computed here.
    """
    checksums = checksums or {}
    schema = None
    if paths:
        with open_input(paths[0]) as fh:
            schema = pq.read_schema(fh)
    id_type = schema.field(id_col).type if schema is not None and id_col in schema.names else None
    return {
        "format": PROVENANCE_FORMAT,
        "id_col": id_col,
        "id_type": str(id_type),
        "columns": list(columns),
        "files": dict(
            zip(
                names,
                map_files(lambda p: _file_record(str(p), columns, checksums.get(str(p))), paths),
                strict=True,
            )
        ),
    }


def _columns_of(loc: Any) -> list[str]:
    with loc.open_input_file() as fh:
        return pq.read_schema(fh).names


def _same_file(entry: dict[str, Any], loc: Any, columns: Sequence[str]) -> str | None:
    """None when ``loc`` is the recorded file ``entry``, else why not."""
    info = loc.info()
    if info.size is not None and info.size != entry["size_bytes"]:
        return f"its size is {info.size:,} bytes, not {entry['size_bytes']:,}"
    if not loc.is_local:  # no checksum of remote bytes: rows and size only
        with loc.open_input_file() as fh:
            rows = pq.ParquetFile(fh).metadata.num_rows
        if rows != entry["num_rows"]:
            return f"it has {rows:,} rows, not {entry['num_rows']:,}"
        return None
    path = os.path.abspath(loc.path)
    st = os.stat(path)
    if path == entry["path"] and st.st_mtime_ns == entry["mtime_ns"]:
        return None  # the very file, untouched since the selection read it
    try:
        checksum = content_checksum(path, columns)
    except (KeyError, ValueError, OSError, pa.ArrowException) as exc:
        return f"its columns cannot be fingerprinted ({str(exc).splitlines()[0]})"
    return None if checksum == entry["checksum"] else "its content differs"


def verify_inputs(
    record: dict[str, Any] | None,
    inputs: Sequence[tuple[str, Any]],
    *,
    selection: str,
    what: str = "--input",
) -> int:
    """Refuse inputs that are not what the selection was made from; returns how many matched.

    Parameters
    ----------
    record : dict or None
        The selection's ``provenance`` block (None: a selection without one, e.g. a
        hand-made list of ids; nothing is checked).
    inputs : sequence of (name, Location)
        The input files with their names relative to the input.
    selection : str
        The selection, as the message names it.

    Raises
    ------
    ValueError
        A parquet input named like a recorded file whose size or content differs, or one
        holding every recorded column that matches no recorded file.
    """
    if not record or not record.get("files"):
        return 0
    files: dict[str, dict[str, Any]] = record["files"]
    columns = record.get("columns") or []
    by_checksum = {e["checksum"]: n for n, e in files.items()}
    fix = (
        f"give the {what} the selection was made from, or select again on this one ("
        f"{TRUST_FLAG} skips this check, e.g. for the same rows re-encoded)."
    )
    matched = 0
    for name, loc in inputs:
        if not name.lower().endswith((".parquet", ".pq")):
            continue  # texts (.jsonl): checked by their ids
        entry = files.get(name)
        if entry is not None:
            why = _same_file(entry, loc, columns)
            if why is not None:
                raise ValueError(
                    f"{what} shard {loc.uri} is not the file the selection {selection} was "
                    f"made from ({entry['path']}): {why}; {fix}"
                )
            matched += 1
            continue
        present = set(_columns_of(loc))
        if not columns or not set(columns) <= present:
            continue  # another table of the corpus (its texts, say): checked by ids
        checksum = content_checksum(loc.path, columns) if loc.is_local else None
        if checksum is not None and checksum in by_checksum:
            matched += 1  # a renamed or copied input file
            continue
        listed = ", ".join(list(files)[:3]) + (", ..." if len(files) > 3 else "")
        raise ValueError(
            f"{what} shard {loc.uri} holds the columns the selection {selection} read "
            f"({', '.join(columns)}) but is none of the {len(files)} file(s) it was made "
            f"from ({listed}); {fix}"
        )
    return matched


def warn_trust_unused(selection: str, why: str) -> None:
    """An escape hatch that matches nothing says so: ``--trust-selection`` given where
    there was no check to skip (a selection without a provenance record)."""
    warnings.warn(f"{TRUST_FLAG} skips nothing for {selection}: {why}.", UserWarning, stacklevel=3)


def selection_record(selection: str | Path) -> dict[str, Any] | None:
    """The ``provenance`` block of a selection parquet's summary, or of a sharded output
    folder's manifest; None for a selection without one (a text file of ids, a hand-made
    parquet of ids, a file made before). Local or remote: a remote selection is checked too."""
    loc = resolve(str(selection), what="selection")
    if loc.is_dir():
        manifest = loc.join("manifest.json")
        if not manifest.is_file():
            return None
        return json.loads(manifest.read_text()).get("provenance")
    if not loc.is_file():
        return None
    try:
        summary = read_summary(selection)
    except ValueError:
        return None  # not parquet: read_selection reads it as a list of ids
    return (summary or {}).get("provenance")


def verify_selection_file(
    selection: str | Path, input: str | Path, *, split: str | None = None
) -> int:
    """``evaluate``'s and ``report``'s check: a selection parquet's record against the
    input it is scored on (any input ``select`` takes: a parquet file, folder or glob).

    A selection that is not parquet (a text file of ids) or holds no record, and input
    files that are not parquet (a ``save_to_disk`` folder's Arrow files), are not checked.
    """
    record = selection_record(selection)
    if not record or not record.get("files"):
        return 0
    kind, files = input_files(str(input), split=split)
    if kind != "parquet" or not files:
        return 0
    names = input_names(str(input), files)
    inputs = [(name, resolve(str(f))) for name, f in zip(names, files, strict=True)]
    return verify_inputs(record, inputs, selection=str(selection))
