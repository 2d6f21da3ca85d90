"""Reading a selection back: a ``datamask select`` output, a parquet of ids or a text file
of ids, as rows of the corpus it was made from (``datamask evaluate``)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .fs import Location, expect_file, folder_kind, resolve
from .parquet import read_summary
from .retry import raise_if_unavailable

__all__ = [
    "SELECTION_FILES",
    "SELECTIONS",
    "selection_summary",
    "output_manifest",
    "read_selection",
    "read_selection_ids",
    "rows_from_ids",
    "summary_is_current",
]

#: What a one-file selection argument accepts, as refusals say it.
SELECTION_FILES = (
    "one selection file: the parquet `datamask select` writes for one input file, a "
    "parquet of ids, or a text file of ids (one per line)"
)


#: What ``evaluate`` and ``report`` take as a selection, as refusals say it.
SELECTIONS = f"{SELECTION_FILES}, or a sharded `datamask select` output folder"


def selection_summary(path: str | Path, *, what: str, then: str) -> dict[str, Any] | None:
    """A selection argument checked before any work, and its summary: a sharded run's
    output folder (finished: its manifest, :func:`output_manifest`) or a file (the summary
    of a ``datamask select`` parquet; None for a list of ids). Anything else is refused,
    named for what it is, with what :data:`SELECTIONS` are accepted."""
    loc = resolve(str(path), what=what)
    if loc.is_dir():
        return output_manifest(loc, what=what, accepted=SELECTIONS, then=then)
    expect_file(loc, what=what, accepted=SELECTIONS)
    return read_summary(path) if str(path).endswith(".parquet") else None


def output_manifest(loc: Location, *, what: str, accepted: str, then: str) -> dict[str, Any] | None:
    """The ``manifest.json`` of the folder ``loc``, a finished sharded ``datamask select``
    output (None for one with ``selected/`` parts but no manifest, made before it).

    Raises
    ------
    ValueError
        ``loc`` is another folder (named for what it is, with what ``what`` ``accepted``),
        its manifest is not JSON, or the run is unfinished (rerun it, ``then`` do what was
        asked).
    """
    manifest_loc = loc.join("manifest.json")
    if not (manifest_loc.is_file() or loc.join("selected").is_dir()):
        found = folder_kind(loc)
        raise ValueError(
            f"{what} {loc.uri!r} is a folder ({found or 'no manifest.json'}), not a "
            f"sharded `datamask select` output; give {accepted}."
        )
    if not manifest_loc.is_file():  # made before the manifest: its parts, if any
        if not _selected_parts(loc):
            raise ValueError(
                f"{what} {loc.uri!r} is a folder (a sharded `datamask select` output without "
                f"manifest.json or selected parts: an unfinished run); give {accepted}."
            )
        return None
    try:
        manifest = json.loads(manifest_loc.read_text())
    except ValueError:
        raise ValueError(
            f"{manifest_loc.uri} is not readable JSON; it is not a finished `datamask "
            "select` output. Rerun the select command that made it."
        ) from None
    if manifest.get("complete") is not True:
        parts = _selected_parts(loc)
        raise ValueError(
            f"{what} {loc.uri!r} is an unfinished `datamask select` run (its "
            f"manifest.json says complete: false; {len(parts)} selected part(s) so far); "
            f"rerun the same select command to finish it, then {then}."
        )
    _check_parts(loc, manifest, what)
    return manifest


def _selected_parts(loc: Location) -> list[Location]:
    """The parquet parts of a sharded run's ``selected/`` folder (one listing, by path)."""
    return [f for f in loc.join("selected").walk() if f.path.endswith(".parquet")]


def _check_parts(loc: Location, manifest: dict[str, Any], what: str) -> None:
    """A finished run's ``selected/`` holds the parts its manifest counts: a part deleted
    (or another added) since would silently drop (or add) selected documents."""
    expected = (manifest.get("output") or {}).get("parts")
    if not isinstance(expected, int):
        return  # a manifest made before it counted them
    found = [f.name for f in _selected_parts(loc)]
    if len(found) != expected:
        raise ValueError(
            f"{what} {loc.uri!r} holds {len(found)} selected part(s) ({_names(found)}) where "
            f"its manifest.json says the run wrote {expected}: parts were deleted or added "
            "since it finished. Restore them from a copy of the output, or select again."
        )


def _names(found: Sequence[str], shown: int = 3) -> str:
    if not found:
        return "none"
    return ", ".join(found[:shown]) + (
        f", ... {len(found) - shown} more" if len(found) > shown else ""
    )


def summary_is_current(summary: dict[str, Any] | None, rows_digest: str, where: str) -> bool:
    """Whether a selection's summary (or manifest) describes its rows as they are now: its
    ``selection_digest`` is the digest of the selected ids read from the rows. A selection
    edited after ``datamask select`` wrote it (rows removed, added or flipped) is not: a
    warning says so, and callers use its rows, never the summary's keep lists or terms.
    A summary without a digest (made before it was recorded, or none) counts as current."""
    recorded = (summary or {}).get("selection_digest")
    if recorded is None or recorded == rows_digest:
        return True
    warnings.warn(
        f"{where} was edited after `datamask select` wrote it: its selected rows are not "
        "those its summary (and keep lists) describe; it is read as its rows say now.",
        UserWarning,
        stacklevel=3,
    )
    return False


def rows_from_ids(data_ids: np.ndarray, chosen: Sequence[Any], where: str) -> np.ndarray:
    """Row indices of the ids ``chosen`` in ``data_ids`` (compared as strings)."""
    keys = np.asarray([str(v) for v in data_ids], dtype=object)
    index: dict[str, int] = {}
    for i, key in enumerate(keys):
        if index.setdefault(key, i) != i:
            raise ValueError(f"id {key!r} occurs more than once in the data; ids must be unique.")
    rows, missing, seen = [], [], set()
    for value in chosen:
        key = str(value)
        if key in seen:
            raise ValueError(f"id {key!r} is listed twice in {where}.")
        seen.add(key)
        row = index.get(key)
        if row is None:
            missing.append(key)
        else:
            rows.append(row)
    if missing:
        raise ValueError(
            f"{len(missing)} id{'s' if len(missing) != 1 else ''} in {where} "
            f"{'are' if len(missing) != 1 else 'is'} not in the data (first: {missing[0]!r}); "
            "was the selection made from another file, or with another --id-col?"
        )
    if not rows:
        raise ValueError(f"{where} selects no documents.")
    return np.asarray(rows, dtype=np.int64)


def read_selection_ids(
    path: str | Path | Location,
    *,
    id_col: str = "chunk_id",
    what: str = "selection",
    folder: bool = False,
) -> pa.Array:
    """The ids a selection keeps, read from its rows (never from its summary), as stored
    (strings for a text file). The one reader of a selection's rows: ``evaluate``,
    ``report``, ``apply`` and ``--given-selection`` all read through it.

    Accepts the output of ``datamask select`` (parquet with the id column and a boolean
    ``selected`` column: the ids where it is true), a parquet of ids only (every id listed
    is kept; a single-column file may name its column anything), or a text file with one
    id per line; with ``folder``, a sharded ``datamask select`` output too (its
    ``selected/*.parquet`` parts). Another folder is refused, named a folder (``what``
    names the argument). Local or remote (a :class:`~datamask.io.fs.Location`).
    """
    loc = path if isinstance(path, Location) else resolve(str(path), what=what)
    if folder and loc.is_dir():
        parts = _selected_parts(loc)
        if parts:  # a finished run's, every part its manifest counts
            output_manifest(loc, what=what, accepted=SELECTIONS, then="use it")
            return pa.concat_arrays([_parquet_ids(f, id_col) for f in parts])
        # no parts: refused below, the folder named for what it is
    expect_file(loc, what=what, accepted=SELECTION_FILES)
    suffix = Path(loc.path).suffix.lower()
    if suffix in (".txt", ".ids", ".csv", ".tsv"):
        raw = loc.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ValueError(
                f"{what} {loc.uri!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line "
                f"{line} cannot be decoded; re-encode the file as UTF-8."
            ) from None
        chosen = [line.strip() for line in text.splitlines() if line.strip()]
        if chosen and suffix in (".csv", ".tsv") and chosen[0] == id_col:
            chosen = chosen[1:]  # header line
        return pa.array(chosen, type=pa.string())
    return _parquet_ids(loc, id_col)


def _parquet_ids(loc: Location, id_col: str) -> pa.Array:
    """The selected ids of one selection parquet: only its id and ``selected`` columns are
    read."""
    where = loc.uri
    try:
        with loc.open_input_file() as fh:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            col = id_col if id_col in names else names[0] if len(names) == 1 else None
            if col is None:
                raise ValueError(
                    f"column {id_col!r} not found in {where}; available columns: {names}. "
                    "Pass the id column with --id-col."
                )
            table = pf.read(columns=[col, "selected"] if "selected" in names else [col])
    except (pa.ArrowException, OSError) as exc:  # pyarrow raises several types for a bad file
        raise_if_unavailable(exc, f"reading {where!r}")
        raise ValueError(f"cannot read selection {where!r} as parquet: {exc}") from None
    ids_col = table.column(col)
    if ids_col.null_count:
        raise ValueError(f"selection {where} has {ids_col.null_count} null ids.")
    ids = ids_col.combine_chunks()
    if "selected" in table.column_names:
        flags = table.column("selected")
        if not pa.types.is_boolean(flags.type):
            raise ValueError(f"column 'selected' in {where} must be boolean; got {flags.type}.")
        if flags.null_count:
            raise ValueError(f"column 'selected' in {where} has {flags.null_count} nulls.")
        ids = ids.filter(flags.combine_chunks())
    return ids


def read_selection(
    path: str | Path, data_ids: np.ndarray, *, id_col: str = "chunk_id", folder: bool = False
) -> np.ndarray:
    """Rows of the data kept by the selection ``path`` (any form :func:`read_selection_ids`
    reads; with ``folder``, a sharded output too)."""
    ids = read_selection_ids(path, id_col=id_col, folder=folder).to_pylist()
    return rows_from_ids(data_ids, ids, str(path))
