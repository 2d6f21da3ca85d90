"""Per-input-file keep lists: which rows of each input shard a selection keeps.

``datamask select`` writes them at the end of a run, so that ``datamask apply`` filters
each shard with only that shard's list in memory (never all selected ids at once)::

    OUT/keep/<name>                  sharded select (OUT is the output folder)
    OUT/<stem>.keep/<name>           one-file select (beside OUT/<stem>.parquet)
    .../_index.json                  written last: id column, selection id, per-file counts

``<name>`` is the input shard's path relative to the input folder (or to the folder of a
glob's first wildcard, or its file name for a single file), with ``.parquet`` appended
when it does not end so. Each list is a parquet of the kept rows, ascending: ``row``
(int64, the row's position in the shard) and the id column (checked by ``apply`` against
the shard, so a shard rewritten since the selection is refused). The selection id is a
BLAKE2b digest of the sorted hashes of every selected id: equal for equal selections,
whichever file or layout holds them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from .atomic import atomic_write_json
from .fs import is_uri, open_input, storage_path
from .parquet import atomic_write_table, read_table
from .shards import hash_ids

__all__ = [
    "KEEP_INDEX",
    "IdSet",
    "input_names",
    "keep_dir_for",
    "keep_file_name",
    "find_kept_rows",
    "finish_keep_lists",
    "keep_index",
    "keep_lists_for_output",
    "read_selected_ids",
    "relative_names",
    "selection_digest",
    "write_keep_list",
    "write_keep_lists",
]

KEEP_INDEX = "_index.json"


def keep_dir_for(selection: str, *, folder: bool) -> str:
    """Where the keep lists of a selection live: ``<folder>/keep`` inside a sharded one,
    ``<stem>.keep`` beside a file one (``<name>.keep`` for a name without ``.parquet``);
    ``/``-joined, any filesystem."""
    text = selection.rstrip("/")
    if folder:
        return text + "/keep"
    return text.removesuffix(".parquet") + ".keep"


def keep_file_name(name: str) -> str:
    """The keep list's file name for an input shard's relative name."""
    return name if name.endswith(".parquet") else name + ".parquet"


def relative_names(root: str, files: Sequence[str]) -> list[str]:
    """Names of ``files`` relative to ``root`` (a folder, or a file: its folder).

    A file outside ``root`` (a list of files from several folders) is named relative to
    their common folder.
    """
    paths = [str(f) for f in files]
    base = root.rstrip("/")
    if base in paths:  # a single file
        base = base.rsplit("/", 1)[0] if "/" in base else ""
    prefix = base + "/" if base else ""
    if not base or not all(p.startswith(prefix) for p in paths):
        common = os.path.commonpath([os.path.dirname(p) or "." for p in paths])
        prefix = common.rstrip("/") + "/" if common and common != "." else ""
    return [p[len(prefix) :] for p in paths]


def selection_digest(ids: pa.Array | pa.ChunkedArray) -> str:
    """BLAKE2b of the sorted 64-bit hashes of ``ids``: the identity of a selection."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    h = np.sort(hash_ids(ids)) if len(ids) else np.zeros(0, np.uint64)
    return hashlib.blake2b(h.tobytes(), digest_size=16).hexdigest()


class IdSet:
    """An exact membership test for a set of ids, held as sorted 64-bit hashes.

    Memory: the ids themselves plus 8 bytes each. :meth:`positions` hashes a batch, finds
    candidates by binary search and confirms each one by comparing the ids, so a hash
    collision never admits a wrong row.

    Examples
    --------
    >>> import pyarrow as pa
    >>> IdSet(pa.array(["b", "d"])).positions(pa.array(["a", "b", "c", "d"])).tolist()
    [1, 3]
    """

    def __init__(self, ids: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        h = hash_ids(ids) if len(ids) else np.zeros(0, np.uint64)
        order = np.argsort(h, kind="stable")
        self._hash = h[order]
        self._order = order
        self._ids = ids.take(pa.array(order, type=pa.int64()))
        self.type = ids.type
        self.digest = hashlib.blake2b(self._hash.tobytes(), digest_size=16).hexdigest()

    def __len__(self) -> int:
        return len(self._hash)

    def positions(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Sorted positions (int64) of the members of ``ids``."""
        return self.find(ids)[0]

    def find(self, ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, members)``: the sorted positions of the members of ``ids``, and
        for each its row in the array the set was built from.

        >>> IdSet(pa.array(["b", "d"])).find(pa.array(["d", "x", "b"]))[1].tolist()
        [1, 0]
        """
        none = np.zeros(0, np.int64)
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not len(ids) or not len(self._hash):
            return none, none
        h = hash_ids(ids)
        lo = np.searchsorted(self._hash, h, side="left")
        hi = np.searchsorted(self._hash, h, side="right")
        cand = np.flatnonzero(hi > lo)
        if not len(cand):
            return none, none
        try:
            same = pc.equal(ids.take(pa.array(cand)), self._ids.take(pa.array(lo[cand])))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ValueError(
                f"ids of type {ids.type} cannot be compared with selected ids of type "
                f"{self._ids.type}; use the id column the selection was made with."
            ) from None
        ok = same.to_numpy(zero_copy_only=False).astype(bool)
        at = lo[cand].copy()
        # A hash shared by several selected ids (rare): compare with every one of them.
        for j in np.flatnonzero(~ok & (hi[cand] - lo[cand] > 1)):
            c = int(cand[j])
            value = ids[c]
            match = [p for p in range(lo[c], hi[c]) if self._ids[int(p)] == value]
            if match:
                ok[j], at[j] = True, match[0]
        return cand[ok].astype(np.int64), self._order[at[ok]].astype(np.int64)


def keep_index(id_col: str, selection: str, n_selected: int) -> dict[str, Any]:
    """The head of ``_index.json``; its ``files`` are filled in input order."""
    return {
        "format": "datamask.keep/1",
        "id_col": id_col,
        "selection": selection,
        "n_selected": n_selected,
        "files": {},
    }


def find_kept_rows(
    path: str | Path, lookup: IdSet, id_col: str, batch_size: int = 262_144
) -> tuple[np.ndarray, pa.Array, int]:
    """Stream the id column of ``path`` once: ``(rows, ids, num_rows)`` of its members of
    ``lookup`` (rows ascending, ids as stored in the file)."""
    with open_input(path) as fh:  # ranged reads of the id column
        pf = pq.ParquetFile(fh)
        rows_parts, id_parts = [], []
        offset = 0
        for batch in pf.iter_batches(batch_size=batch_size, columns=[id_col]):
            ids = batch.column(0)
            hit = lookup.positions(ids)
            rows_parts.append(hit + offset)
            id_parts.append(ids.take(pa.array(hit)))
            offset += batch.num_rows
        rows = np.concatenate(rows_parts) if rows_parts else np.zeros(0, np.int64)
        id_type = pf.schema_arrow.field(id_col).type
        kept_ids = pa.concat_arrays(id_parts) if id_parts else pa.array([], type=id_type)
    return rows.astype(np.int64), kept_ids, offset


def write_keep_list(
    rows: np.ndarray,
    ids: pa.Array,
    source: str,
    num_rows: int,
    keep_dir: str | Path,
    name: str,
    id_col: str,
) -> None:
    """Write one input file's keep list (``row`` ascending, the id column) atomically."""
    if name.startswith("/") or ".." in name.split("/"):  # never write outside keep_dir
        raise RuntimeError(f"keep-list name {name!r} is not relative; please report this.")
    table = pa.table({"row": pa.array(rows.astype(np.int64)), id_col: ids})
    meta = {"source": source, "num_rows": num_rows, "id_col": id_col}
    table = table.replace_schema_metadata({b"datamask.keep": json.dumps(meta).encode()})
    atomic_write_table(table, storage_path(keep_dir) / keep_file_name(name))


def finish_keep_lists(index: dict[str, Any], keep_dir: str | Path) -> dict[str, Any]:
    """Check every selected id was found in some file, then write ``_index.json`` last."""
    found = sum(f["kept"] for f in index["files"].values())
    if found != index["n_selected"]:
        raise RuntimeError(
            f"the keep lists hold {found:,} ids where the selection has "
            f"{index['n_selected']:,}; were the input files or the selected parts changed "
            "during the run?"
        )
    atomic_write_json(index, storage_path(keep_dir) / KEEP_INDEX)
    return index


def write_keep_lists(
    files: Sequence[str | Path],
    names: Sequence[str],
    selected_ids: pa.Array | pa.ChunkedArray,
    keep_dir: str | Path,
    *,
    id_col: str,
    batch_size: int = 262_144,
    progress: bool = False,
) -> dict[str, Any]:
    """Write one keep list per input file, then ``_index.json``; returns the index.

    Streams the id column of every file once and finds its selected rows by hash (exactly:
    every hash match is confirmed by comparing the ids). Memory: the selected ids and 8
    bytes per selected id for their hashes, plus one batch of ids.

    Parameters
    ----------
    files : sequence of path
        The local parquet files the selection was made from, in the run's order.
    names : sequence of str
        Their relative names (see :func:`relative_names`).
    selected_ids : pyarrow.Array
        Every selected id, as stored.
    keep_dir : str or Path
        Output folder (replaced file by file, each atomically; the index last).
    id_col : str
        The id column.

    Raises
    ------
    RuntimeError
        When some selected ids are not found in ``files`` (the inputs changed).
    """
    keep_dir = storage_path(keep_dir)
    lookup = IdSet(selected_ids)
    index = keep_index(id_col, lookup.digest, len(lookup))
    bar = tqdm(files, desc="keep lists", unit="file", disable=not progress, dynamic_ncols=True)
    for path, name in zip(bar, names, strict=True):
        rows, kept_ids, num_rows = find_kept_rows(path, lookup, id_col, batch_size)
        write_keep_list(rows, kept_ids, str(path), num_rows, keep_dir, name, id_col)
        index["files"][name] = {"num_rows": num_rows, "kept": len(rows)}
    return finish_keep_lists(index, keep_dir)


def read_selected_ids(output: str | Path, id_col: str) -> pa.ChunkedArray | pa.Array:
    """Every selected id of a sharded ``select`` output (``OUT/selected/*.parquet``)."""
    parts = sorted((storage_path(output) / "selected").glob("*.parquet"), key=str)
    pieces = [read_table(p, columns=[id_col]).column(0) for p in parts]
    chunks = [c for piece in pieces for c in piece.chunks]
    return pa.chunked_array(chunks) if chunks else pa.array([], pa.string())


def _source_root(source: Any) -> str | None:
    """The folder relative names are taken from, for a ``select`` input (None: a list)."""
    if not isinstance(source, str | Path):
        return None
    text = str(source)
    if is_uri(text):  # object storage: the URI's folder, as written
        head = re.split(r"[*?\[]", text, maxsplit=1)[0]
        return head.rsplit("/", 1)[0] if glob.has_magic(text) else text.rstrip("/")
    if not Path(text).exists() and glob.has_magic(text):
        head = re.split(r"[*?\[]", text, maxsplit=1)[0]
        return os.path.abspath(head.rsplit("/", 1)[0] if "/" in head else ".")
    return os.path.abspath(text)


def input_names(source: Any, files: Sequence[str | Path]) -> list[str]:
    """The names of a ``select`` run's input ``files`` relative to its ``source``: what
    keep lists and the provenance record call them."""
    absolute = [str(storage_path(str(f))) for f in files]
    return relative_names(_source_root(source) or "", absolute)


def keep_lists_for_output(
    output: str | Path,
    source: Any,
    files: Sequence[str | Path],
    *,
    id_col: str,
    selected_ids: pa.Array | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Write the keep lists of a finished ``select`` run; both select paths call this.

    Parameters
    ----------
    output : str or Path
        The run's output: a file (one-file select: lists go to ``<stem>.keep/``) or a
        folder (sharded select: ``OUT/keep/``, and the selected ids
        are read from ``OUT/selected/*.parquet`` when ``selected_ids`` is None).
    source : str, Path or list
        The run's ``--input`` (names are relative to it).
    files : sequence of path
        The parquet files read, in order.
    id_col : str
        The id column.
    selected_ids : pyarrow.Array, optional
        Every selected id.

    Returns
    -------
    dict
        The index written to ``_index.json``.
    """
    out = str(output)
    keep_dir = keep_dir_for(out, folder=storage_path(out).is_dir())
    if selected_ids is None:
        selected_ids = read_selected_ids(out, id_col)
    absolute = [str(storage_path(str(f))) for f in files]
    names = input_names(source, files)
    return write_keep_lists(
        absolute, names, selected_ids, keep_dir, id_col=id_col, progress=progress
    )
