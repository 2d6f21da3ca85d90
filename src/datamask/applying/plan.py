"""What decides the kept rows: the selection's keep lists (per shard) or its selected ids,
and the checks that the input is what the selection was made from."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..io.fs import Location
from ..io.keep import KEEP_INDEX, IdSet, keep_dir_for, keep_file_name
from ..io.parquet import SUMMARY_KEY, parquet_errors, read_table
from ..io.provenance import TRUST_FLAG, id_kind
from ..io.selection import output_manifest, read_selection_ids, summary_is_current
from .inputs import _id_batches


@dataclass
class _Plan:
    """What decides the kept rows: keep lists (per shard) or one set of selected ids."""

    mode: str  # "keep" or "ids"
    selection_id: str
    keep_dir: Location | None = None
    ids: IdSet | None = None
    cover: _Cover | None = None  # what --removed carries: each dropped row's cover


#: What ``apply --selection`` accepts, as refusals say it.
SELECTIONS = (
    "the parquet `datamask select` writes for one input file, a parquet of selected ids, "
    "or a sharded `datamask select` output folder"
)

#: The columns ``--removed`` carries for every dropped row (docs/incremental.md).
CARRIED = ("covered_by", "covered_sim")


class _Cover:
    """The cover of the dropped rows, read once from the selection (one file's
    ``covered_by``/``covered_sim`` columns, or a sharded run's ``covered/`` dataset):
    their ids (an :class:`IdSet`) and the two columns, about the ids twice plus 12 bytes
    per dropped row."""

    def __init__(self, table: pa.Table, id_col: str) -> None:
        self.set = IdSet(table.column(id_col))
        self.columns = {c: table.column(c).combine_chunks() for c in CARRIED}

    def columns_for(self, ids: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
        """``covered_by`` and ``covered_sim`` of ``ids`` (null where the selection has no
        cover for a row)."""
        rows, members = self.set.find(ids)
        at = np.full(len(ids), -1, dtype=np.int64)
        at[rows] = members
        index = pa.array(np.where(at >= 0, at, 0))
        missing = pa.array(at < 0)
        return {
            c: pc.if_else(missing, pa.scalar(None, col.type), col.take(index))
            if len(col)
            else pa.nulls(len(ids), col.type)
            for c, col in self.columns.items()
        }


def _read_cover(sel: Location, is_dir: bool, id_col: str) -> _Cover | None:
    """The dropped rows' cover of a selection, or None where it has none (made before
    covered_by, or with --selected-only)."""
    if is_dir:
        files = [f for f in sel.join("covered").walk() if f.path.endswith(".parquet")]
    else:
        files = [sel]
    tables = []
    for f in files:
        with f.open_input_file() as fh:
            pf = pq.ParquetFile(fh)
            if not {id_col, "selected", *CARRIED} <= set(pf.schema_arrow.names):
                return None
            t = pf.read(columns=[id_col, "selected", *CARRIED])
        tables.append(t.filter(pc.invert(t.column("selected"))))
    return _Cover(pa.concat_tables(tables), id_col) if tables else None


def _read_json(loc: Location) -> dict[str, Any] | None:
    if not loc.is_file():
        return None
    try:
        return json.loads(loc.read_text())
    except ValueError:
        return None


def _selection_meta(sel: Location) -> tuple[bool, dict[str, Any] | None]:
    """(is a folder, its summary or manifest)."""
    info = sel.info()
    if info.type.name == "NotFound":
        raise ValueError(f"--selection {sel.uri!r} does not exist.")
    if info.type.name == "Directory":
        manifest = output_manifest(sel, what="--selection", accepted=SELECTIONS, then="apply")
        return True, manifest
    with parquet_errors(sel.uri, "--selection "), sel.open_input_file() as fh:
        meta = pq.read_schema(fh).metadata or {}
    text = meta.get(SUMMARY_KEY)
    return False, None if text is None else json.loads(text)


def _plan(
    sel: Location, is_dir: bool, meta: dict[str, Any] | None, names: list[str], id_col: str
) -> _Plan:
    """Keep lists when they are the lists of the selection's rows as they are now, else its
    selected ids. The rows decide, never the summary: a selection edited after it was
    written (rows removed or added) no longer has the digest its keep lists were made for,
    and is applied as its rows say (as ``evaluate`` reads it)."""
    ids = IdSet(read_selection_ids(sel, id_col=id_col, what="--selection", folder=is_dir))
    summary_is_current(meta, ids.digest, f"--selection {sel.uri!r}")  # warns when not
    keep = Location(
        keep_dir_for(sel.uri, folder=is_dir),
        sel.scheme,
        sel.fs,
        keep_dir_for(sel.path, folder=is_dir),
    )
    index = _read_json(keep.join(KEEP_INDEX))  # the lists of these rows, or of others
    if index is not None and index.get("selection") == ids.digest:
        listed = [n for n in names if n in index["files"]]
        if len(listed) == len(names):
            root = keep.path.rstrip("/") + "/"
            there = {f.path[len(root) :] for f in keep.walk()}  # one listing
            lost = [n for n in names if keep_file_name(n) not in there]
            if not lost:
                return _Plan("keep", ids.digest, keep_dir=keep)
            warnings.warn(  # the lists only save reading ids: the selection's rows decide
                f"{len(lost)} keep list(s) of {keep.uri} are missing (first: "
                f"{keep_file_name(lost[0])!r}); applying by the selection's ids instead.",
                UserWarning,
                stacklevel=2,
            )
            return _Plan("ids", ids.digest, ids=ids)
        if listed:
            missing = next(n for n in names if n not in index["files"])
            raise ValueError(
                f"input shard {missing!r} has no keep list in {keep.uri} although "
                f"{len(listed)} other input shards have one; give the --input the selection "
                "was made from."
            )
    return _Plan("ids", ids.digest, ids=ids)


class _KeepList:
    """One shard's keep list: kept row positions (and ids) handed out batch by batch."""

    def __init__(self, loc: Location, id_col: str) -> None:
        table = read_table(loc)
        meta = json.loads((table.schema.metadata or {}).get(b"datamask.keep", b"{}"))
        self.uri = loc.uri
        self.rows = table.column("row").to_numpy()
        self.ids = table.column(id_col) if id_col in table.column_names else None
        self.num_rows = meta.get("num_rows")

    def take(self, start: int, n: int) -> tuple[np.ndarray, pa.Array | None]:
        lo, hi = np.searchsorted(self.rows, [start, start + n])
        ids = None if self.ids is None else self.ids.slice(int(lo), int(hi - lo))
        return self.rows[lo:hi] - start, ids


def _probe_ids(
    shards: list[Location],
    formats: list[str],
    plan: _Plan,
    id_col: str,
    batch_size: int,
    selection: str,
) -> None:
    """Without keep lists: the input's ids are of the selection's kind and some are
    selected. Reads ids until the first selected one (one batch, for the right input)."""
    if plan.ids is None or not len(plan.ids):
        return
    want = id_kind(plan.ids.type)
    n_read = 0
    for src, fmt in zip(shards, formats, strict=True):
        for ids in _id_batches(src, fmt, id_col, batch_size):
            if len(ids) and id_kind(ids.type) != want:
                raise ValueError(
                    f"ids in {src.uri} are {ids.type} (first: {ids[0].as_py()!r}) but the "
                    f"selection {selection}'s ids are {plan.ids.type}; no row can match. Give "
                    "the input the selection was made from, or convert one id column."
                )
            if len(plan.ids.positions(ids)):
                return
            n_read += len(ids)
    raise ValueError(
        f"none of the {len(plan.ids):,} selected ids of {selection} is in --input "
        f"({n_read:,} rows of {len(shards)} shard(s) read, id column {id_col!r}); the "
        f"selection was made from another corpus or with another --id-col ({TRUST_FLAG} "
        "writes the empty shards anyway)."
    )
