"""``select(source, output, spec)``: the one pipeline behind ``datamask select``.

A single parquet file (or a ``save_to_disk`` folder) is a plan with one group: its rows
are read, :func:`~datamask.pipeline.step.fit_group` selects, and the writer writes every
row with its rank (``output``) and the summary beside it. A folder, a glob or a list of
shards (or any input with ``shards=True``) is planned into groups by
:func:`datamask.distributed.runner.run_selection`, which runs the same step per group and
writes ``output/`` as a dataset of parts with ``manifest.json``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .._device import set_threads
from ..config import SelectSpec
from ..distributed import runner as sharded
from ..io.atomic import OutputLock, check_no_overlap, check_writable
from ..io.datasets import input_column_names, is_save_to_disk, read_input_corpus
from ..io.keep import input_names, keep_dir_for, keep_lists_for_output, selection_digest
from ..io.parquet import summary_path, write_selection
from ..io.provenance import record_inputs
from ..io.shards import literal_or_glob
from .step import fit_group
from .writer import run_record, selection_table

__all__ = ["is_sharded", "make_runner", "select"]


def is_sharded(source: Any) -> bool:
    """A list of files, a folder (not a save_to_disk one) or a glob; a file whose name holds
    ``[``, ``*`` or ``?`` is taken literally."""
    if isinstance(source, list | tuple):
        return True
    path = str(source)
    if is_save_to_disk(path):
        return False
    return Path(path).is_dir() or literal_or_glob(path) == "glob"


def make_runner(spec: SelectSpec) -> Any:
    """The scheduler ``spec.run`` asks for; nothing is started yet."""
    run = spec.run
    kind = run.runner or ("ray" if run.ray_address else "local")
    if kind == "local":
        if run.ray_address:
            raise ValueError("--ray-address needs --runner ray; got --runner local.")
        return sharded.LocalRunner(workers=run.workers or sharded.available_cpus())
    from ..distributed.ray_backend import RayRunner

    return RayRunner(workers=run.workers, address=run.ray_address, device=spec.selector.device)


def select(
    source: Any,
    output: str | Path,
    spec: SelectSpec | None = None,
    *,
    shards: bool | None = None,
    split: str | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    """Select ``round(select_ratio * N)`` documents of ``source`` and write them.

    Parameters
    ----------
    source : str, Path or list of paths
        One parquet file or ``save_to_disk`` folder, or parquet shards (folder, glob, list).
    output : str or Path
        A parquet file for one file; a folder for shards.
    spec : SelectSpec, optional
        Everything that decides the selection (default ``SelectSpec()``).
    shards : bool, optional
        Plan ``source`` into groups even when it is one file (default: only shards are).
    split : str, optional
        The split of a DatasetDict folder.
    runner : optional
        The sharded runs' scheduler (default: :func:`make_runner` of ``spec``).

    Returns
    -------
    dict
        The summary (one file) or manifest (shards) also written beside the output.
    """
    spec = (spec or SelectSpec()).check()
    threads = set_threads(spec.run.threads)
    in_memory = not isinstance(source, list | tuple) and is_save_to_disk(str(source))
    if in_memory and shards:
        raise ValueError(
            "a save_to_disk folder is selected in one process; for --partition write it as "
            "parquet shards first (Dataset.to_parquet)."
        )
    if shards or (shards is None and is_sharded(source)):
        own = runner is None
        runner = make_runner(spec) if own else runner
        try:
            return sharded.run_selection(
                source,
                output,
                spec,
                runner=runner,
                work_dir=spec.run.work_dir,
                progress=spec.run.progress,
            )
        finally:
            if own:
                runner.close()
    # The output is checked and claimed before any computation: never the input, a
    # writable place, and no other run writing it at the same time.
    check_file_output(output)
    check_writable(output)
    check_no_overlap([output, summary_path(output)], [source])
    with OutputLock(output):
        return _select_file(
            str(source), output, spec, split=split, keep_lists=not in_memory, threads=threads
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
) -> dict[str, Any]:
    """One file: a plan with one group, once the output is claimed."""
    started = time.perf_counter()
    cols = spec.columns
    names = input_column_names(source, split=split)
    missing = [c for c in spec.objective.columns if c not in names]
    if missing:
        raise ValueError(
            f"the terms {list(spec.objective.algorithm)} read column(s) {missing}, not found "
            f"in {source}; available columns: {names}."
        )
    corpus = read_input_corpus(  # a parquet file or a save_to_disk folder
        source,
        split=split,
        id_col=cols.id_col,
        quality_cols=list(cols.quality_cols),
        quality_weights=None if cols.quality_weights is None else list(cols.quality_weights),
        feature_col=cols.feature_col,
        extra_cols=spec.objective.columns,  # what user terms read (requires_columns)
    )
    read_seconds = time.perf_counter() - started
    selection = fit_group(corpus, None, spec, progress=spec.run.progress, describe_graph=True)
    table = selection_table(
        selection,
        id_col=cols.id_col,
        kept_only=spec.run.selected_only,
        logit=not spec.run.selected_only,
    )
    meta = selection.meta
    summary = {
        **run_record(spec, n_docs=corpus.n_docs, k=len(selection.selected), terms=meta["terms"]),
        "dim": corpus.dim,
        "input": source,
        "output": str(output),
        "seconds": {
            "read": read_seconds,
            **{key: meta["seconds"][key] for key in ("fit", "graph", "optimise")},
            "total": time.perf_counter() - started,
        },
        "graph": meta["graph"],
        "device": meta["device"],
        "resolved": meta["resolved"],
        "history": meta["history"],
    }
    summary["settings"]["threads"] = threads  # the count used, not None
    if keep_lists:  # a parquet file: what `apply` and `evaluate` check their input against
        summary["provenance"] = record_inputs(
            [source],
            input_names(source, [source]),
            [c for c in spec.read_columns if c in names],
            id_col=cols.id_col,
        )
    kept_ids = pa.array(corpus.ids[np.sort(selection.selected)])
    summary["selection_digest"] = selection_digest(kept_ids)  # ties the keep lists to it
    write_selection(output, table, summary)  # parquet and summary as one unit
    # Keep lists name rows of parquet inputs (for `datamask apply`); a save_to_disk folder
    # is filtered with Dataset.select on the selection's ids instead.
    if keep_lists:
        keep_lists_for_output(output, source, [source], id_col=cols.id_col, selected_ids=kept_ids)
    summary["keep_lists"] = keep_lists
    return summary
