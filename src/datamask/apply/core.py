"""Turn a selection into a dataset: stream each input shard, keep the selected rows.

    datamask apply --input data/ --selection out/sel --output out/kept --removed out/dropped

One output shard per input shard, with the same relative name and format (parquet,
``.jsonl`` or ``.jsonl.gz``), holding every column of the kept rows in their input order.
Each shard is streamed batch by batch and written atomically (see
:meth:`datamask.io.fs.Location.open_atomic`); after it (and its removed rows) is in
place, a completion marker ``OUT/_datamask_apply/done/<name>.json`` is written. A rerun
skips shards with a marker, so a killed run resumes; ``OUT/_datamask_apply/state.json``
records which selection the folder holds, and a rerun with another selection is refused.

Which rows are kept comes from the selection's per-file keep lists (see
:mod:`datamask.io.keep`): one shard's list in memory at a time, and each kept row's id is
checked against the list. When the selection has no keep lists for these shards (they
are, say, the original ``.jsonl.gz`` texts of an embedded parquet), rows are matched by
id against the selection's selected ids (held once, 8 bytes per id plus the ids).

``removed`` writes what was dropped, one file per input shard, in one of three layouts:

- ``ids``: ``REMOVED/<name>.parquet``, the id column of the dropped rows;
- ``rows``: ``REMOVED/<name>``, the dropped rows with every column, in the input's format;
- ``curator``: ``REMOVED/part.<i>.parquet``, one column ``id`` sorted ascending, the
  layout NeMo Curator's ``TextDuplicatesRemovalWorkflow(ids_to_remove_path=REMOVED,
  duplicate_id_field="id", id_field=<your id column>)`` reads (its removal stage loads the
  ids in each batch's min/max range with parquet filters, so the ids are sorted and
  written in row groups of ``max(1000, min(n // 10, 1_000_000))`` rows, as Curator's own
  identification stages write them).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from .._validation import check_choice
from ..io.atomic import OutputLock, to_json
from ..io.fs import Location, cache_dir, check_reachable, expand, glob_root, resolve
from ..io.keep import KEEP_INDEX, IdSet, keep_dir_for, keep_file_name, relative_names
from ..io.parquet import SUMMARY_KEY, parquet_batches, parquet_num_rows, read_table
from ..io.provenance import TRUST_FLAG, id_kind, verify_inputs

__all__ = ["REMOVED_FORMATS", "SHARD_SUFFIXES", "apply_selection"]

REMOVED_FORMATS = ("ids", "rows", "curator")
SHARD_SUFFIXES = (".parquet", ".pq", ".jsonl", ".jsonl.gz")  # any letter case
STATE_DIR = "_datamask_apply"


def _format(name: str) -> str:
    lower = name.lower()
    for suffix, fmt in ((".jsonl.gz", "jsonl.gz"), (".jsonl", "jsonl"), (".parquet", "parquet")):
        if lower.endswith(suffix):
            return fmt
    if lower.endswith(".pq"):
        return "parquet"
    raise ValueError(f"input shard {name!r} must end in .parquet, .pq, .jsonl or .jsonl.gz.")


@dataclass
class _Plan:
    """What decides the kept rows: keep lists (per shard) or one set of selected ids."""

    mode: str  # "keep" or "ids"
    selection_id: str
    keep_dir: Location | None = None
    ids: IdSet | None = None


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
        manifest_loc = sel.join("manifest.json")
        manifest = _read_json(manifest_loc)
        if manifest is None and manifest_loc.is_file():
            raise ValueError(
                f"{manifest_loc.uri} is not readable JSON; it is not a finished `datamask "
                "select` output. Rerun the select command that made it."
            )
        if manifest is not None and manifest.get("complete") is not True:
            parts = [f for f in sel.join("selected").walk() if f.path.endswith(".parquet")]
            raise ValueError(
                f"--selection {sel.uri!r} is an unfinished `datamask select` run (its "
                f"manifest.json says complete: false; {len(parts)} selected part(s) so far); "
                "rerun the same select command to finish it, then apply."
            )
        return True, manifest
    try:
        with sel.open_input_file() as fh:
            meta = pq.read_schema(fh).metadata or {}
    except Exception as exc:
        raise ValueError(f"cannot read --selection {sel.uri!r} as parquet: {exc}") from None
    text = meta.get(SUMMARY_KEY)
    return False, None if text is None else json.loads(text)


def _selected_ids(sel: Location, is_dir: bool, id_col: str) -> pa.Array:
    """Every selected id of a selection file or folder (the fallback without keep lists)."""
    files = (
        [f for f in sel.join("selected").walk() if f.path.endswith(".parquet")] if is_dir else [sel]
    )
    if not files:
        raise ValueError(f"--selection {sel.uri!r} holds no selected/*.parquet parts.")
    chunks = []
    for f in files:
        with f.open_input_file() as fh:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            if id_col not in names:
                raise ValueError(
                    f"column {id_col!r} not found in {f.uri}; available columns: {names}; "
                    "pass the id column with --id-col."
                )
            cols = [id_col, "selected"] if "selected" in names else [id_col]
            table = pf.read(columns=cols)
        if "selected" in cols:
            table = table.filter(table.column("selected"))
        chunks.extend(table.column(id_col).chunks)
    return pa.chunked_array(chunks).combine_chunks() if chunks else pa.array([], pa.string())


def _plan(
    sel: Location, is_dir: bool, meta: dict[str, Any] | None, names: list[str], id_col: str
) -> _Plan:
    digest = (meta or {}).get("selection_digest")
    keep = Location(
        keep_dir_for(sel.uri, folder=is_dir),
        sel.scheme,
        sel.fs,
        keep_dir_for(sel.path, folder=is_dir),
    )
    index = _read_json(keep.join(KEEP_INDEX)) if digest else None
    if index is not None and index.get("selection") == digest:
        listed = [n for n in names if n in index["files"]]
        if len(listed) == len(names):
            return _Plan("keep", digest, keep_dir=keep)
        if listed:
            missing = next(n for n in names if n not in index["files"])
            raise ValueError(
                f"input shard {missing!r} has no keep list in {keep.uri} although "
                f"{len(listed)} other input shards have one; give the --input the selection "
                "was made from."
            )
    ids = IdSet(_selected_ids(sel, is_dir, id_col))
    return _Plan("ids", ids.digest, ids=ids)


# --- reading and writing one shard ----------------------------------------------------------
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
        if rem is not None and removed_format == "rows":
            rem_writer = pq.ParquetWriter(
                stack.enter_context(rem.open_atomic()), schema, compression="zstd"
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
                rem_writer.write_batch(batch.filter(pa.array(~mask)))
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
    parts: list[pa.Array], loc: Location, id_col: str, removed_format: str, id_type: Any
) -> None:
    chunks = [c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], id_type or pa.string())
    if removed_format == "curator":
        ids = ids.take(pc.sort_indices(ids))
        table = pa.table({"id": ids})
        row_group = _curator_row_group(len(ids))
    else:
        table = pa.table({id_col: ids})
        row_group = None
    with loc.open_atomic() as fh:
        pq.write_table(table, fh, compression="zstd", row_group_size=row_group)


def _source_stats(src: Location) -> dict[str, Any]:
    """What a done marker remembers of its input shard: a rerun redoes a changed one."""
    info = src.info()
    return {"uri": src.uri, "size": info.size, "mtime_ns": info.mtime_ns}


def _id_batches(src: Location, fmt: str, id_col: str, batch_size: int) -> Iterator[pa.Array]:
    """The id column of one input shard, batch by batch (only that column is decoded)."""
    if fmt == "parquet":
        with src.open_input_file() as fh:
            try:
                pf = pq.ParquetFile(fh)
            except Exception as exc:
                raise ValueError(f"cannot read {src.uri!r} as parquet: {exc}") from None
            if id_col not in pf.schema_arrow.names:
                raise ValueError(
                    f"column {id_col!r} not found in {src.uri}; available columns: "
                    f"{pf.schema_arrow.names}; pass the id column with --id-col."
                )
            try:
                for batch in pf.iter_batches(batch_size=batch_size, columns=[id_col]):
                    yield batch.column(0)
            except Exception as exc:
                raise ValueError(f"cannot read {src.uri!r} as parquet: {exc}") from None
        return
    n = 0
    for lines in _json_lines(src, fmt == "jsonl.gz", batch_size):
        yield _ids_of_lines(lines, id_col, src.uri, n)
        n += len(lines)


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


# --- the command body -----------------------------------------------------------------------
def _claim(out: Location) -> OutputLock:
    """The exclusive claim on an output: a flock beside it (local), or on a local file
    keyed by the URI (remote: this host's runs exclude each other; see docs/remote.md for the
    one-writer rule across hosts)."""
    if out.is_local:
        return OutputLock(out.path, folder=True)
    key = hashlib.sha256(out.uri.rstrip("/").encode()).hexdigest()[:16]
    return OutputLock(cache_dir() / "claims" / key, folder=True)


def _overlaps(a: Location, b: Location) -> bool:
    if a.fs.type_name != b.fs.type_name:
        return False
    pa_, pb = a.path.rstrip("/") + "/", b.path.rstrip("/") + "/"
    return pa_.startswith(pb) or pb.startswith(pa_)


def apply_selection(
    input: str | Path,
    selection: str | Path,
    output: str | Path,
    *,
    removed: str | Path | None = None,
    removed_format: str = "ids",
    id_col: str = "chunk_id",
    batch_size: int = 65_536,
    progress: bool = True,
    trust_selection: bool = False,
) -> dict[str, Any]:
    """Write the rows of ``input`` that ``selection`` keeps, one output shard per input shard.

    Parameters
    ----------
    input : str or Path
        Input shards: a file, a folder (every ``.parquet``, ``.jsonl`` and ``.jsonl.gz``
        below it) or a glob; local or ``file://``, ``s3://``, ``gs://``, ``hf://``.
    selection : str or Path
        ``datamask select``'s output: a parquet file (with ``selected``, or selected ids
        only) or a sharded output folder.
    output : str or Path
        Output folder: ``<name>`` for every input shard ``<name>``.
    removed : str or Path, optional
        Folder for what is dropped (see ``removed_format``). Default: not written.
    removed_format : {"ids", "rows", "curator"}, default="ids"
        See the module docstring.
    id_col : str, default="chunk_id"
        Id column of the input shards.
    batch_size : int, default=65_536
        Rows per streamed batch (memory is about one batch of every column).
    progress : bool, default=True
        Show a progress bar over rows.
    trust_selection : bool, default=False
        Skip the provenance checks (``docs/provenance.md``): the input's fingerprints
        against the selection's record, and (without keep lists) that the input's ids
        are of the selection's type and that some are selected.

    Returns
    -------
    dict
        ``n_shards``, ``shards_done``, ``shards_reused``, ``rows``, ``kept``, ``mode``
        (``"keep"`` lists or ``"ids"``), ``seconds``, ``rows_per_second``.

    Raises
    ------
    ValueError
        Bad arguments, unreadable inputs, an unfinished selection, an input that is not
        what the selection was made from (``docs/provenance.md``), an output holding
        another selection or input, a shard changed since the selection; all before
        anything is written, except a shard found bad while streaming (its partial
        output is never put in place).
    """
    started = time.perf_counter()
    check_choice("removed_format", removed_format, REMOVED_FORMATS)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
    src = resolve(input, what="--input")
    sel = resolve(selection, what="--selection")
    out = resolve(output, what="--output")
    rem = resolve(removed, what="--removed") if removed is not None else None
    for loc, what in (
        (src, "--input"),
        (sel, "--selection"),
        (out, "--output"),
        (rem, "--removed"),
    ):
        if loc is not None:
            check_reachable(loc, what=what)
    shards = _input_shards(src, sel)
    for target, what in ((out, "--output"), (rem, "--removed")):
        if target is None:
            continue
        for other in (src, sel):
            if _overlaps(target, other):
                raise ValueError(
                    f"{what} {target.uri!r} overlaps {other.uri!r}; writing it would "
                    "overwrite or hide the input. Choose another folder."
                )
    if rem is not None and _overlaps(out, rem):
        raise ValueError(f"--removed {rem.uri!r} overlaps --output {out.uri!r}; choose another.")
    if out.is_file():
        raise ValueError(f"--output {out.uri!r} is a file; apply writes a folder.")
    names = relative_names(glob_root(src), [s.path for s in shards])
    formats = [_format(n) for n in names]
    is_dir, meta = _selection_meta(sel)
    if not trust_selection:  # before anything is written: is this what it was made from?
        verify_inputs((meta or {}).get("provenance"), list(zip(names, shards, strict=True)),
                      selection=sel.uri)  # fmt: skip
    plan = _plan(sel, is_dir, meta, names, id_col)
    if plan.mode == "ids" and not trust_selection:
        _probe_ids(shards, formats, plan, id_col, batch_size, sel.uri)
    state = {
        "format": "datamask.apply/1",
        "input": os.path.abspath(src.path) if src.is_local else src.uri.rstrip("/"),
        "selection_id": plan.selection_id,
        "id_col": id_col,
        "removed": None if rem is None else rem.uri,
        "removed_format": None if rem is None else removed_format,
    }
    total = None
    if all(f == "parquet" for f in formats):
        total = 0
        for s in shards:
            total += parquet_num_rows(s)

    with ExitStack() as claims:  # released in reverse; on an error, made folders go too
        claims.enter_context(_claim(out))
        if rem is not None:
            claims.enter_context(_claim(rem))
        state_loc = out.join(STATE_DIR, "state.json")
        previous = _read_json(state_loc)
        if state_loc.is_file() and previous is None:
            raise ValueError(
                f"{state_loc.uri} is not readable JSON; delete {out.uri} (or that file) to "
                "apply again."
            )
        if previous is not None and "input" not in previous:  # written before inputs were
            previous = {**previous, "input": state["input"]}  # recorded: each marker checks
        if previous is not None and previous != state:
            changed = [k for k in state if previous.get(k) != state[k]]
            raise ValueError(
                f"--output {out.uri!r} holds rows applied with another {changed[0]} "
                f"({previous.get(changed[0])!r}, now {state[changed[0]]!r}); choose another "
                "--output or delete it."
            )

        def record_state() -> None:  # with the first finished shard: a run that fails
            if previous is None and not state_loc.is_file():  # first leaves no folder
                state_loc.write_text(to_json(state))

        result = _run(
            shards,
            names,
            formats,
            out,
            rem,
            removed_format,
            plan,
            id_col,
            batch_size,
            progress,
            total,
            record_state,
        )
    seconds = time.perf_counter() - started
    return {
        **result,
        "mode": plan.mode,
        "selection_id": plan.selection_id,
        "seconds": seconds,
        "rows_per_second": result["rows"] / seconds if seconds > 0 else None,
    }


def _run(
    shards: list[Location],
    names: list[str],
    formats: list[str],
    out: Location,
    rem: Location | None,
    removed_format: str,
    plan: _Plan,
    id_col: str,
    batch_size: int,
    progress: bool,
    total: int | None,
    record_state: Callable[[], None],
) -> dict[str, Any]:
    done_dir = out.join(STATE_DIR, "done")
    rows = kept = reused = 0
    bar = tqdm(
        total=total,
        desc="apply",
        unit="row",
        unit_scale=True,
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for i, (src, name, fmt) in enumerate(zip(shards, names, formats, strict=True)):
            marker = done_dir.join(name + ".json")
            stats = _read_json(marker)
            source = _source_stats(src)
            if stats is not None and stats.get("source", source) != source:
                stats = None  # the input shard changed since it was applied: apply it again
            if stats is not None:
                rows += stats["rows"]
                kept += stats["kept"]
                reused += 1
                bar.update(stats["rows"])
                continue
            target = out.join(name)
            target.clean_temporaries()
            keep = None
            if plan.mode == "keep":
                keep = _KeepList(plan.keep_dir.join(keep_file_name(name)), id_col)
            rem_target = None
            if rem is not None:
                rem_target = {
                    "rows": rem.join(name),
                    "ids": rem.join(keep_file_name(name)),
                    "curator": rem.join(f"part.{i}.parquet"),
                }[removed_format]
                rem_target.clean_temporaries()
            args = (src, target, rem_target, removed_format, plan, keep, id_col, batch_size, bar)
            if fmt == "parquet":
                n, k, removed_ids = _apply_parquet(*args)
            else:
                n, k, removed_ids = _apply_jsonl(*args, gz=fmt == "jsonl.gz")
            if keep is not None and keep.num_rows is not None and keep.num_rows != n:
                target.delete()
                raise ValueError(
                    f"{src.uri} has {n} rows but had {keep.num_rows} when the selection was "
                    "made; select again."
                )
            if rem_target is not None and removed_format != "rows":
                id_type = removed_ids[0].type if removed_ids else None
                _write_removed_ids(removed_ids, rem_target, id_col, removed_format, id_type)
            stats = {"shard": name, "rows": n, "kept": k, "removed": n - k, "index": i}
            record_state()
            marker.write_text(to_json({**stats, "source": source}))
            rows += n
            kept += k
    finally:
        bar.close()
    return {
        "n_shards": len(shards),
        "shards_done": len(shards) - reused,
        "shards_reused": reused,
        "rows": rows,
        "kept": kept,
        "output": out.uri,
        "removed": None if rem is None else rem.uri,
    }
