"""The library's doors, one per command, each ``door(input, [selection,] output, spec=None,
**settings)``: :func:`select`, :func:`evaluate`, :func:`apply`, :func:`report`,
:func:`bench` and :func:`embed`; and :func:`select_table` (an in-memory table).

    >>> import datamask
    >>> datamask.select("docs.parquet", "out/selection.parquet", select_ratio=0.1)  # doctest: +SKIP
    >>> datamask.evaluate("docs.parquet", "out/selection.parquet", None)  # doctest: +SKIP

Every door makes its one spec the same way (:meth:`datamask.settings.Spec.of`: ``spec``,
with the keyword settings over it, an unknown key refused), sets the CPU threads
(``threads``), and claims its output in the library before any work: it is never an
input (``check_no_overlap``), it is writable, and no other run writes it at the same time
(``OutputLock``; a remote one is staged here, or claimed where it lies).

``select``: a single parquet file (or a ``save_to_disk`` folder) is a plan with one group: its rows
are read, :func:`~datamask.pipeline.step.fit_group` selects, and the writer writes every
row with its rank (``output``) and the summary beside it. A folder, a glob or a list of
shards (or any input with ``shards=True``) is planned into groups by
:func:`datamask.distributed.runner.run_selection`, which runs the same step per group and
writes ``output/`` as a dataset of parts with ``manifest.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._device import set_threads
from .config import SelectSpec
from .data import Corpus
from .distributed.executors import LocalRunner, available_cpus
from .distributed.runner import run_selection
from .io.atomic import OutputLock, check_no_overlap, check_writable
from .io.claim import claim_output
from .io.datasets import (
    input_column_names,
    is_save_to_disk,
    is_sharded,
    read_input_corpus,
    resolve_input,
)
from .io.fs import check_reachable, is_uri, open_input, resolve
from .io.keep import input_names, keep_dir_for, keep_lists_for_output, selection_digest
from .io.parquet import corpus_from_table, summary_path, write_selection
from .io.provenance import record_inputs
from .io.remote import overlaps, staged_paths
from .io.shards import list_shards
from .io.text import lengths_from_arrow
from .pipeline.given import budget_and_given, given_terms
from .pipeline.step import cover_rows, fit_and_cover, graph_summary
from .pipeline.tokens import token_length_column, token_summary
from .pipeline.writer import cover_summary, run_record, selection_table, warn_ignored

__all__ = ["is_sharded", "make_runner", "select", "select_table"]


def make_runner(spec: SelectSpec) -> Any:
    """The scheduler ``spec.run`` asks for; nothing is started yet."""
    run = spec.run
    kind = run.runner or ("ray" if run.ray_address else "local")
    if kind == "local":
        if run.ray_address:
            raise ValueError("--ray-address needs --runner ray; got --runner local.")
        return LocalRunner(workers=run.workers or available_cpus())
    from .distributed.ray_backend import RayRunner

    return RayRunner(
        workers=run.workers,
        address=run.ray_address,
        gpus_per_task=run.gpus_per_task,
        device=spec.selector.device,
    )


def _spec_of(spec: SelectSpec | None, settings: dict[str, Any], where: str) -> SelectSpec:
    """The one spec of a call: ``spec``, with the keyword settings over it (checked as the
    flags are)."""
    return SelectSpec.of(spec, settings, where=where)


def select(
    input: Any,
    output: str | Path,
    spec: SelectSpec | None = None,
    *,
    shards: bool | None = None,
    split: str | None = None,
    scheduler: Any = None,
    **settings: Any,
) -> dict[str, Any]:
    """Select ``round(select_ratio * N)`` documents of ``input`` and write them.

    Parameters
    ----------
    input : str, Path or list of paths
        One parquet file or ``save_to_disk`` folder, or parquet shards (folder, glob, list).
        ``s3://``, ``gs://``, ``hf://`` and ``file://`` URIs are read as ``datamask select``
        reads them (:mod:`datamask.io.remote`).
    output : str or Path
        A parquet file for one file; a folder for shards. A remote URI is written when the
        selection is complete (one file), or in place by the steps (shards: with
        ``s3://``/``gs://`` shards, output or work dir, nothing is staged on this host).
    spec : SelectSpec, optional
        Everything that decides the selection (default: every default); ``settings`` are
        applied over it.
    shards : bool, optional
        Plan ``input`` into groups even when it is one file (default: only shards are).
    split : str, optional
        The split of a DatasetDict folder or of a Hub-style parquet folder.
    scheduler : optional
        The sharded runs' scheduler, a started ``LocalRunner`` or ``RayRunner`` (default:
        the one the ``runner`` setting names, :func:`make_runner`).
    **settings
        Any setting of ``datamask select`` by its key, over ``spec``: ``select_ratio``,
        ``method``, ``seed``, ``preset``, ``id_col``, ``quality_col``, ``n_epochs``, ...;
        ``k`` (instead of ``select_ratio``) and ``given`` / ``given_selection`` (documents
        already kept: select from ``input`` only, :mod:`datamask.pipeline.given`).

    Returns
    -------
    dict
        The summary (one file) or manifest (shards) also written beside the output.
    """
    source = input
    spec = _spec_of(spec, settings, "select's arguments")
    chosen = spec.selector
    paths = {
        "input": source,
        "output": output,
        "work_dir": spec.run.work_dir,
        "given": chosen.given,
        "given_selection": chosen.given_selection,
    }
    inputs = ("input", "given", "given_selection")
    if _in_place(source, output, spec.run.work_dir, shards, chosen.given, chosen.given_selection):
        return _select_in_place(source, output, spec, scheduler)
    with staged_paths(paths, inputs=inputs, suffixes=(".parquet",)) as local:
        if local["work_dir"] != spec.run.work_dir:
            spec = spec.evolve(run=replace(spec.run, work_dir=local["work_dir"]))
        given = (local["given"], local["given_selection"])
        return _select(local["input"], local["output"], spec, shards, split, scheduler, given)


def _remote(place: Any) -> bool:
    """An object-storage URI (a malformed one is worded by :func:`staged_paths`)."""
    if not isinstance(place, str | Path) or not is_uri(str(place)):
        return False
    try:
        return not resolve(place).is_local
    except ValueError:
        return False


def _in_place(source: Any, output: Any, work_dir: Any, shards: bool | None, *given: Any) -> bool:
    """A sharded run with an ``s3://`` or ``gs://`` input, output, work dir, ``--given``
    or ``--given-selection``: its steps read and write the URIs themselves, wherever they
    run; nothing of the input, ``--given`` or the work dir is staged on the driver."""
    items = list(source) if isinstance(source, list | tuple) else [source]
    if not any(_remote(p) for p in [*items, output, work_dir, *given]):
        return False
    if shards or isinstance(source, list | tuple):
        return True
    if _remote(source):  # refused by name where it cannot be reached
        check_reachable(resolve(source, what="--input"), what="--input")
    return is_sharded(source)


def _select_in_place(
    source: Any, output: str | Path, spec: SelectSpec, runner: Any
) -> dict[str, Any]:
    """:func:`select` of a sharded run on URIs (see :func:`_in_place`)."""
    sources = [resolve(s) for s in (source if isinstance(source, list | tuple) else [source])]
    given = (spec.selector.given, spec.selector.given_selection)
    for what, place in zip(("--given", "--given-selection"), given, strict=True):
        if _remote(place):  # read in place by the steps: reached once here, at the door
            check_reachable(resolve(place, what=what), what=what)
    for what, place in (("--output", output), ("--work-dir", spec.run.work_dir)):
        if not _remote(place):
            continue
        loc = resolve(place, what=what)
        check_reachable(loc, what=what)
        for s in sources:  # a remote folder cannot skip its own output as a local one does
            if overlaps(loc, s):
                raise ValueError(
                    f"{what} {loc.uri!r} overlaps --input {s.uri!r}; writing it would "
                    "overwrite or hide the input. Choose another output."
                )
    files = list_shards(source)
    with open_input(files[0]) as fh:
        names = list(pq.read_schema(fh).names)
    spec = spec.evolve(columns=spec.columns.resolve(names, where=str(source))).check()
    set_threads(spec.run.threads)
    own = runner is None
    with ExitStack() as claims:  # one run per remote output, from any host (io/claim.py)
        # (a local output or work dir is claimed by run_selection's flock)
        if _remote(output):
            claims.enter_context(claim_output(resolve(output, what="--output"), folder=True))
        work = spec.run.work_dir
        if _remote(work) and not str(work).startswith(str(output).rstrip("/") + "/"):
            claims.enter_context(claim_output(resolve(work, what="--work-dir"), folder=True))
        runner = make_runner(spec) if own else runner
        try:
            return run_selection(
                source, output, spec, runner=runner, work_dir=spec.run.work_dir,
                progress=spec.run.progress, given=given if given[0] is not None else None,
            )  # fmt: skip
        finally:
            if own:
                runner.close()


def _select(
    source: Any,
    output: str | Path,
    spec: SelectSpec,
    shards: bool | None,
    split: str | None,
    runner: Any,
    given: tuple[Any, Any] = (None, None),
) -> dict[str, Any]:
    """:func:`select` on local paths: columns resolved, the spec checked once, then run.
    ``given``: the local paths of ``--given`` and ``--given-selection``."""
    if isinstance(source, str | Path):
        source = resolve_input(str(source), split=split)
    names = input_column_names(source, split=split)
    spec = spec.evolve(columns=spec.columns.resolve(names, where=str(source))).check()
    threads = set_threads(spec.run.threads)
    in_memory = not isinstance(source, list | tuple) and is_save_to_disk(str(source))
    if in_memory and shards:
        raise ValueError(
            "a save_to_disk folder is selected in one process; for --partition write it as "
            "parquet shards first (Dataset.to_parquet)."
        )
    sharded = bool(shards or (shards is None and is_sharded(source)))
    warn_ignored(spec, sharded)  # a setting this run does not read: said, not recorded
    if sharded:
        own = runner is None
        runner = make_runner(spec) if own else runner
        try:
            return run_selection(
                source,
                output,
                spec,
                runner=runner,
                work_dir=spec.run.work_dir,
                progress=spec.run.progress,
                given=given if given[0] is not None else None,
            )
        finally:
            if own:
                runner.close()
    # The output is checked and claimed before any computation: never the input, a
    # writable place, and no other run writing it at the same time.
    check_file_output(output)
    check_writable(output)
    check_no_overlap([output, summary_path(output)], [source, *(g for g in given if g)])
    with OutputLock(output):
        return _select_file(
            str(source),
            output,
            spec,
            split=split,
            keep_lists=not in_memory,
            threads=threads,
            given=given,
        )


def check_file_output(output: str | Path) -> None:
    """A one-file selection's output, decided before any computation: a file path (not
    ``dir/``) whose own name and those written beside it (summary, keep lists, the hidden
    temporaries and lock) are legal on its file system."""
    text = str(output)
    if text.endswith(("/", os.sep)):
        raise ValueError(
            f"--output {text!r} names a folder, but selecting from one file writes one "
            f"parquet file; give a file path such as '{text.rstrip('/')}/selection.parquet' "
            "(or --shards to write a folder)."
        )
    out = Path(output)
    parent = out.parent if out.parent.exists() else Path(".")
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for name in (out.name, summary_path(out).name, Path(keep_dir_for(text, folder=False)).name):
        if len(name.encode()) > limit:
            raise ValueError(
                f"--output {out.name!r} is too long: the file {name!r} written for it is "
                f"{len(name.encode())} bytes, over this file system's {limit}-byte limit on "
                "a name; give a shorter name."
            )


def _select_file(
    source: str,
    output: str | Path,
    spec: SelectSpec,
    *,
    split: str | None,
    keep_lists: bool,
    threads: int,
    given: tuple[Any, Any] = (None, None),
) -> dict[str, Any]:
    """One file: a plan with one group, once the output is claimed; with ``given``
    (``--given`` and ``--given-selection``), the new documents' floors and the union's
    rate first (:mod:`datamask.pipeline.given`)."""
    started = time.perf_counter()
    cols = spec.columns
    corpus, names = _read_file(source, spec, split)
    read_seconds = time.perf_counter() - started
    k, fit_spec, kept, given_info, kept_cover = budget_and_given(corpus, spec, given)
    given_seconds = time.perf_counter() - started - read_seconds
    # The input's fingerprints (a full-file checksum: 3.9 s of a 1M-row file's 34 s on an
    # H200) are hashed in a thread while the selection runs (hashlib and file reads
    # release the GIL); a failed fit waits for it, then raises.
    with ThreadPoolExecutor(1, thread_name_prefix="datamask-provenance") as pool:
        provenance = (
            pool.submit(_file_provenance, source, names, spec, kept) if keep_lists else None
        )
        cover = not spec.run.selected_only  # the kept rows alone: each covers itself
        selection, objective = fit_and_cover(
            corpus,
            k,
            fit_spec,
            cover=cover and kept is None,  # given KEPT: read from the scoring pass below
            progress=spec.run.progress,
            evaluate=kept is None,  # given KEPT, the terms are scored below instead
        )
        selection.meta["graph"] = None if objective is None else graph_summary(objective)
        del objective
    terms = selection.meta["terms"]
    if kept is not None:
        scoring = time.perf_counter()
        scored = given_terms(corpus, kept, selection.selected, spec.objective.lamb)
        terms, given_info["terms_union"] = scored["given"], scored["union"]
        given_info["seconds"] = {  # read --given and the floors; score J given and union J
            "read_and_floors": given_seconds,
            "score": time.perf_counter() - scoring,
        }
        if cover:  # every new row against S in that pass; KEPT's rows as the floor
            covering = time.perf_counter()
            selection.meta["cover"] = cover_rows(
                corpus, selection.selected, floor=kept_cover, nearest=scored["nearest"]
            )
            selection.meta.setdefault("seconds", {})["cover"] = time.perf_counter() - covering
    table = selection_table(
        selection,
        id_col=cols.id_col,
        cover_external_ids=None if kept is None else pa.array(kept.corpus.ids),
        kept_only=spec.run.selected_only,
        logit=not spec.run.selected_only,
    )
    places = (source, output)
    summary = _file_summary(spec, corpus, selection, terms, places, read_seconds, started)
    summary["settings"]["threads"] = threads  # the count used, not None
    if corpus.lengths is not None:
        summary["tokens"] = token_summary(spec, corpus, selection.selected, names)
    if given_info is not None:
        summary["given"] = given_info
        summary["terms_union"] = given_info.pop("terms_union")
    if provenance is not None:  # a parquet file: what `apply` and `evaluate` check against
        summary["provenance"] = provenance.result()
    kept_ids = pa.array(corpus.ids[np.sort(selection.selected)])
    summary["selection_digest"] = selection_digest(kept_ids)  # ties the keep lists to it
    write_selection(output, table, summary)  # parquet and summary as one unit
    # Keep lists name rows of parquet inputs (for `datamask apply`); a save_to_disk folder
    # is filtered with Dataset.select on the selection's ids instead.
    if keep_lists:
        keep_lists_for_output(output, source, [source], id_col=cols.id_col, selected_ids=kept_ids)
    summary["keep_lists"] = keep_lists
    return summary


def _read_file(source: str, spec: SelectSpec, split: str | None) -> tuple[Corpus, list[str]]:
    """The corpus of one file (a parquet file or a save_to_disk folder), with the columns
    the terms read; and the file's column names."""
    names = input_column_names(source, split=split)
    missing = [c for c in spec.objective.columns if c not in names]
    if missing:
        raise ValueError(
            f"the terms {list(spec.objective.algorithm)} read column(s) {missing}, not found "
            f"in {source}; available columns: {names}."
        )
    length = token_length_column(spec, names, source)
    extra = list(spec.objective.columns)  # what user terms read (requires_columns)
    corpus = read_input_corpus(
        source,
        spec.columns,
        split=split,
        extra_cols=extra + ([length] if length and length not in extra else []),
    )
    if length is not None:
        values = corpus.extra[length] if length in extra else corpus.extra.pop(length)
        corpus.lengths = lengths_from_arrow(pa.array(values), length, source)
    return corpus, names


def _file_summary(
    spec: SelectSpec,
    corpus: Corpus,
    selection: Any,
    terms: dict[str, Any],
    places: tuple[str, str | Path],
    read_seconds: float,
    started: float,
) -> dict[str, Any]:
    """The summary of one file's selection: the run record, the places, the timings and
    what the selector reports (graph, cover, device, stats, history)."""
    meta = selection.meta
    source, output = places
    return {
        **run_record(
            spec, n_docs=corpus.n_docs, k=len(selection.selected), terms=terms, sharded=False
        ),
        "dim": corpus.dim,
        "input": source,
        "output": str(output),
        "seconds": {
            "read": read_seconds,
            **{
                key: meta["seconds"].get(key)
                for key in ("fit", "graph", "optimise", "evaluate", "cover")
            },
            "total": time.perf_counter() - started,
        },
        "graph": meta["graph"],
        "cover": cover_summary(meta["cover"], meta["seconds"]["cover"])
        if "cover" in meta
        else None,
        "device": meta["device"],
        "resolved": meta["resolved"],
        "stats": meta["stats"],  # the selector's own counts and times (the swap rounding's)
        "history": meta["history"],
    }


def _file_provenance(source: str, names: list[str], spec: SelectSpec, kept: Any) -> dict[str, Any]:
    """What ``apply`` and ``evaluate`` check their input against: the input's fingerprints
    (and ``--given``'s files, recorded like the input)."""
    columns = [c for c in spec.read_columns if c in names]
    id_col = spec.columns.id_col
    record = record_inputs([source], input_names(source, [source]), columns, id_col=id_col)
    if kept is not None and kept.files:
        record["given"] = record_inputs(
            kept.files, input_names(kept.source, kept.files), columns, id_col=id_col
        )
    return record


# --- an in-memory table -------------------------------------------------------------------
def _as_arrow(data: Any, columns: Sequence[str] | None) -> pa.Table:
    """``data`` as a pyarrow Table (only ``columns`` when given), respecting row order."""
    if isinstance(data, pa.Table):
        return data if columns is None else data.select(list(columns))
    if isinstance(data, pa.RecordBatch):
        return _as_arrow(pa.Table.from_batches([data]), columns)
    if hasattr(data, "with_format") and hasattr(data, "select_columns"):  # datasets.Dataset
        if columns is not None:
            data = data.select_columns(list(columns))
        # The arrow formatter honours an indices mapping (after .select / .shuffle), which
        # the raw ``.data`` table does not.
        return data.with_format("arrow")[:]
    if hasattr(data, "with_format") and hasattr(data, "iter"):  # datasets.IterableDataset
        raise TypeError(
            "select_table needs all rows at once; got a streaming IterableDataset. "
            "Load it as a Dataset, or write it to parquet and use `datamask select`."
        )
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas.DataFrame
        frame = data if columns is None else data[list(columns)]
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise TypeError(
        "data must be a pyarrow.Table, a datasets.Dataset or a pandas.DataFrame; "
        f"got {type(data).__name__}."
    )


def _column_names(data: Any) -> list[str]:
    if isinstance(data, pa.Table | pa.RecordBatch):
        return list(data.schema.names)
    names = getattr(data, "column_names", None)
    if names is None:
        names = getattr(data, "columns", None)
    if names is None:
        return list(_as_arrow(data, None).schema.names)
    return [str(c) for c in names]


def select_table(
    data: Any, spec: SelectSpec | None = None, *, progress: bool = False, **settings: Any
) -> pa.Table:
    """Select ``round(select_ratio * n)`` rows of a table; one answer row per input row.

    Parameters
    ----------
    data : pyarrow.Table, datasets.Dataset or pandas.DataFrame
        Rows with an id column (optional), one or more quality columns and an embedding
        column (list or fixed-size list of floats). Only those columns are read.
    spec : SelectSpec, optional
        Everything that decides the selection (default: from ``settings``).
    progress : bool, default=False
        The method's progress bar.
    **settings
        Any setting of ``datamask select`` by its key, checked and defaulted as there
        (:class:`datamask.config.SelectSpec`): ``select_ratio``, ``lamb``, ``method``,
        ``algorithm``, ``seed``, ``device``, ``max_similarity``, ``n_epochs``, ``knn``, ...
        and the columns (:class:`datamask.columns.Columns`): ``preset`` (a known layout;
        None detects the names), ``id_col``, ``quality_col`` (a name or a list of names),
        ``quality_weights`` and ``feature_col`` (explicit names win over the preset).
        Without an id column the row numbers are the ids.

    Returns
    -------
    pyarrow.Table
        One row per input row, in input order: the id column (or ``row`` alone),
        ``row`` (int64 position in ``data``), ``selected`` (bool), ``logit``,
        ``probability`` (mask learner only), ``rank`` (1 = best), and the nearest kept
        row of every row: ``covered_by`` (its id, or its row number without an id
        column), ``covered_sim`` (float32 cosine; 1.0 for a kept row, which covers
        itself) and ``covered_exact`` (docs/incremental.md).
        ``data.select(table.filter(table["selected"])["row"].to_pylist())`` keeps the
        selection.

    Raises
    ------
    ValueError
        For a missing column, null ids or embeddings, or an invalid setting.
    TypeError
        For an unsupported ``data`` type.
    """
    spec = _spec_of(spec, settings, "select_table's arguments")
    names = _column_names(data)
    cols = spec.columns.resolve(names, where="data", rows_as_ids=True)
    numbered = cols.id_col is None  # no id column: the row numbers are the ids
    if numbered:
        cols = replace(cols, id_col="row")
    spec = spec.evolve(columns=cols).check()
    wanted = cols.read[1:] if numbered else cols.read
    length = token_length_column(spec, names, "data")
    if length is not None and length not in wanted:
        wanted = [*wanted, length]
    for name in wanted:
        if name not in names:
            raise ValueError(f"column {name!r} not found in data; available columns: {names}.")
    table = _as_arrow(data, wanted)
    if table.num_rows == 0:
        raise ValueError("data has no rows.")
    rows = np.arange(table.num_rows, dtype=np.int64)
    if numbered:
        table = table.append_column("row", pa.array(rows))
    corpus = corpus_from_table(table, "data", cols)
    if length is not None:
        corpus.lengths = lengths_from_arrow(table.column(length), length, "data")
    given = (spec.selector.given, spec.selector.given_selection)
    k, fit_spec, kept, _, kept_cover = budget_and_given(corpus, spec, given)
    selection, _ = fit_and_cover(
        corpus, k, fit_spec, cover=True, floor=kept_cover, progress=progress
    )
    out = selection_table(
        selection,
        id_col=cols.id_col,
        cover_external_ids=None if kept is None else pa.array(kept.corpus.ids),
    )
    if numbered:
        return out
    return out.add_column(1, "row", pa.array(rows))
