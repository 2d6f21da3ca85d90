"""The doors besides ``select``: ``evaluate``, ``apply``, ``report``, ``bench`` and
``embed``, each ``(input[, selection], output, spec=None, **settings)``, each claiming,
locking and checking its output in the library as :func:`datamask.select` does."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._device import set_threads
from .applying import ApplySpec, apply_selection
from .data import Corpus
from .embedding import EmbedSpec, embed_file
from .evaluation import BenchSpec, EvaluateSpec, ReportSpec, build_report, write_report
from .evaluation import bench as run_bench
from .evaluation.evaluate_run import evaluate_file, read_scored_corpus
from .io.atomic import OutputLock, check_no_overlap, check_writable
from .io.fs import is_uri
from .io.remote import staged_paths
from .io.text import list_text_files

__all__ = ["apply", "bench", "embed", "evaluate", "report"]


def evaluate(
    input: Any,
    selection: str | Path,
    output: str | Path | None,
    spec: EvaluateSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Score a selection of ``input``: the objective J and each term, quality, coverage,
    near-duplicates and lengths (``datamask evaluate``).

    Parameters
    ----------
    input : str or Path
        What the selection was made from (any input ``select`` reads; a URI is staged).
    selection : str or Path
        ``select``'s output, a parquet of selected ids, or a text file of ids.
    output : str, Path or None
        The JSON report (None: ``<selection>.eval.json`` beside the selection).
    spec : EvaluateSpec, optional
        Everything else (default: every default); ``settings`` are applied over it.
    **settings
        Any field of :class:`~datamask.evaluation.EvaluateSpec` by its key: ``algorithm``,
        ``lamb``, the terms' parameters, the columns (``id_col``, ``quality_col``,
        ``feature_col``, ``preset``), ``given``, ``dup_thresholds``, ``threads``, ...

    Returns
    -------
    dict
        The report, also written to ``output``.
    """
    spec = EvaluateSpec.of(spec, settings, where="evaluate's arguments")
    if output is None and is_uri(str(selection)):  # beside the selection, as for a local one
        text = str(selection)
        stem = text.rsplit(".", 1)[0] if "." in text.rsplit("/", 1)[-1] else text
        output = stem + ".eval.json"
    paths = {"input": input, "selection": selection, "output": output}
    with staged_paths(paths, inputs=("input", "selection")) as local:
        set_threads(spec.threads)
        return evaluate_file(local["input"], local["selection"], local["output"], spec)


def apply(
    input: Any,
    selection: str | Path,
    output: str | Path,
    spec: ApplySpec | None = None,
    *,
    removed: str | Path | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Write the rows of ``input`` that ``selection`` keeps, one output shard per input
    shard (``datamask apply``; :func:`datamask.applying.apply_selection`, which claims
    ``output`` and ``removed`` where they lie, local or remote).

    Parameters
    ----------
    input : str or Path
        Input shards: a file, folder or glob of .parquet, .jsonl or .jsonl.gz (or a URI).
    selection : str or Path
        ``select``'s output: a parquet file or a sharded output folder.
    output : str or Path
        The output folder.
    spec : ApplySpec, optional
        Everything else (default: every default); ``settings`` are applied over it.
    removed : str or Path, optional
        A folder for what is dropped (``removed_format``). Default: not written.
    **settings
        Any field of :class:`~datamask.applying.ApplySpec` by its key: ``id_col`` or
        ``preset`` (default: chunk_id, else id, as the input holds), ``removed_format``,
        ``batch_size``, ``trust_selection``, ``progress``, ``threads``.

    Returns
    -------
    dict
        ``n_shards``, ``rows``, ``kept``, ``mode``, ``seconds``, ... (see
        :func:`~datamask.applying.apply_selection`).
    """
    spec = ApplySpec.of(spec, settings, where="apply's arguments")
    set_threads(spec.threads)
    return apply_selection(input, selection, output, removed=removed, spec=spec)


def report(
    input: Any,
    selection: str | Path | Sequence[str | Path],
    output: str | Path,
    spec: ReportSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Write one self-contained HTML page, ``output/index.html``, showing what each
    selection kept (``datamask report``).

    Parameters
    ----------
    input : str or Path
        What the selections were made from: a parquet file, folder or glob, or a
        save_to_disk folder.
    selection : str, Path or list of them
        One selection, or several of the same input shown side by side (the first first).
    output : str or Path
        The page's folder.
    spec : ReportSpec, optional
        Everything else (default: every default); ``settings`` are applied over it.
    **settings
        Any field of :class:`~datamask.evaluation.ReportSpec` by its key: ``n_topics``,
        ``sample_size``, ``map_method``, ``seed``, the columns, ``progress``, ``threads``, ...

    Returns
    -------
    dict
        What the page shows (:func:`~datamask.evaluation.build_report`), ``page``, the
        path or URI of the page written, and ``page_bytes``, its size.
    """
    spec = ReportSpec.of(spec, settings, where="report's arguments")
    single = isinstance(selection, str | os.PathLike)
    selections = [str(s) for s in ([selection] if single else selection)]
    # Before any computation: the page never overwrites the data or a selection. The
    # input and the selections are read where they lie; a remote page is written locally
    # and uploaded once complete.
    check_no_overlap([f"{os.fspath(output).rstrip('/')}/index.html"], [input, *selections])
    with staged_paths({"output": output}, inputs=(), folders=("output",)) as local:
        page = Path(local["output"]) / "index.html"
        check_writable(page)
        set_threads(spec.threads)
        with OutputLock(page):
            built = build_report(str(input), selections, spec)
            path = write_report(built, local["output"])
            size = Path(path).stat().st_size
    if os.fspath(output) != os.fspath(local["output"]):  # uploaded: named where it is
        path = f"{os.fspath(output).rstrip('/')}/{Path(path).name}"
    return {**built, "page": str(path), "page_bytes": size}


def bench(
    input: Any,
    output: str | Path | None,
    spec: BenchSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Run several methods on the same data and objective; write ``bench.md``,
    ``bench.json`` and the PNGs into ``output`` (``datamask bench``).

    Parameters
    ----------
    input : str, Path or Corpus
        A parquet file (read with the spec's columns, ``split`` and ``length_col``; a URI
        is staged) or a :class:`~datamask.Corpus` (e.g. :func:`datamask.make_clustered`).
    output : str, Path or None
        The folder written (None: nothing is written, the result is returned).
    spec : BenchSpec, optional
        Everything else (default: every default); ``settings`` are applied over it.
    **settings
        Any key :meth:`~datamask.evaluation.BenchSpec.from_mapping` takes: ``methods``,
        ``select_ratio``, ``seed``, the objective's keys, any method's parameter, ...

    Returns
    -------
    dict
        The table's rows, the figures and the files written
        (:func:`datamask.evaluation.bench`).
    """
    spec = BenchSpec.of(spec, settings, where="bench's arguments")
    if output is not None and spec.out_dir is not None and spec.out_dir != os.fspath(output):
        raise ValueError(
            f"give the output folder either as output or as out_dir, not both; got "
            f"{os.fspath(output)!r} and {spec.out_dir!r}."
        )
    output = spec.out_dir if output is None else output
    from_file = not isinstance(input, Corpus)
    paths = {"input": input if from_file else None, "output": output}
    with staged_paths(paths, inputs=("input",)) as local:
        out = local["output"]
        if out is not None:
            check_writable(out, folder=True)  # before any method runs
            spec = replace(spec, out_dir=os.fspath(out))
        corpus = input
        if from_file:
            if out is not None:
                check_no_overlap([out], [local["input"]], what="--output")
            corpus, _ = read_scored_corpus(
                local["input"], spec.columns, split=spec.split, length_col=spec.length_col
            )
        with OutputLock(out, folder=True) if out is not None else nullcontext():
            return run_bench(corpus, spec)


def embed(
    input: Any,
    output: str | Path,
    spec: EmbedSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Embed the text column of ``input`` and write its rows with an embedding column
    (``datamask embed``; :func:`datamask.embedding.embed_file`).

    Parameters
    ----------
    input : str, Path or list of them
        A parquet, jsonl or jsonl.gz file, a folder or glob of them, or a list of files (a
        URI is staged).
    output : str or Path
        ``.parquet`` or ``.jsonl`` (a URI is written when the file is complete).
    spec : EmbedSpec, optional
        Everything else (default: every default); ``settings`` are applied over it.
    **settings
        Any field of :class:`~datamask.embedding.EmbedSpec` by its key: ``text_col``,
        ``id_col``, ``feature_col``, ``quality``, ``model``, ``device``, ``progress``,
        ``threads``, ...

    Returns
    -------
    dict
        ``rows`` (the number written) and ``output``.
    """
    spec = EmbedSpec.of(spec, settings, where="embed's arguments")
    with staged_paths({"input": input, "output": output}, inputs=("input",)) as local:
        out = local["output"]
        check_writable(out)
        check_no_overlap([out], list_text_files(local["input"]))
        set_threads(spec.threads)
        with OutputLock(out):
            n = embed_file(local["input"], out, spec)
    return {"rows": n, "output": os.fspath(output)}
