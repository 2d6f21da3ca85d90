"""One ``datamask evaluate`` run: :func:`evaluate_file` scores a selection of an input (a
file, or parquet shards read whole) and writes the JSON report, as named phases over one
:class:`EvaluateRun`.

    >>> evaluation_path("out/selection.parquet")
    PosixPath('out/selection.eval.json')

:func:`_open` checks the places before any work (the report never overwrites the data or
the selection; a folder is refused unless it is a finished sharded ``datamask select``
output, whose ``selected/`` rows are then scored); :func:`_verify` checks that
the input is what the selection was made from (docs/provenance.md); :func:`_score` reads the
corpus and the selection and scores it (and ``given`` when set); the report is written
atomically under the output's lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._memory import available_bytes
from ..columns import Columns
from ..data import Corpus
from ..io.atomic import OutputLock, atomic_write_json, check_no_overlap, check_writable
from ..io.datasets import embedding_size, input_column_names, is_sharded, read_input_corpus
from ..io.provenance import selection_record, verify_selection_file, warn_trust_unused
from ..io.selection import read_selection, selection_summary
from ..pipeline.given import evaluate_given, read_given
from .evaluate_spec import EvaluateSpec
from .scores import LENGTH_COLUMNS, evaluate_selection

__all__ = ["EvaluateRun", "evaluate_file", "evaluation_path", "read_scored_corpus"]


def evaluation_path(selection: str | Path, output: str | Path | None = None) -> Path:
    """Where the report goes: ``output``, else ``<selection>.eval.json`` beside it."""
    if output is not None:
        return Path(output)
    sel = Path(selection)
    return sel.with_name(sel.name.removesuffix(sel.suffix) + ".eval.json")


@dataclass
class EvaluateRun:
    """One evaluation's state, as its phases fill it: the places and the selection's
    summary or manifest (:func:`_open`), the number of input files whose fingerprints were
    checked (:func:`_verify`), then the report (:func:`_score`)."""

    spec: EvaluateSpec
    input: str
    selection: str
    output: Path
    summary: dict[str, Any] | None = None
    verified: int = 0
    report: dict[str, Any] | None = None


def evaluate_file(
    input: str | Path,
    selection: str | Path,
    output: str | Path | None = None,
    spec: EvaluateSpec | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Score the selection file ``selection`` of ``input`` and write the JSON report.

    Parameters
    ----------
    input : str or Path
        The file (or save_to_disk folder), or the parquet shards (a folder or glob), the
        selection was made from: read whole, into memory (refused, before reading, where
        its embeddings would not fit).
    selection : str or Path
        ``datamask select``'s output for one input file, a sharded run's output folder (its
        ``selected/`` rows: J computed over every document, not the lower bound its
        manifest may hold), a parquet of selected ids, or a text file of ids (one per
        line).
    output : str or Path, optional
        The JSON report (default: ``<selection>.eval.json`` beside it).
    spec : EvaluateSpec, optional
        Everything else (default: from ``settings``).
    **settings
        Any key :meth:`EvaluateSpec.from_mapping` takes, instead of ``spec``.

    Returns
    -------
    dict
        :func:`~datamask.evaluation.scores.evaluate_selection`'s report, with ``selection``,
        ``given`` (when set) and ``provenance`` (``trusted``, ``verified_files``).
    """
    spec = EvaluateSpec.of(spec, settings, where="evaluate's arguments")
    run = _open(input, selection, output, spec)
    _verify(run)
    with OutputLock(run.output):
        report = _score(run)
        report["provenance"] = {"trusted": spec.trust_selection, "verified_files": run.verified}
        atomic_write_json(report, run.output)
    run.report = report
    return report


def _open(
    input: str | Path, selection: str | Path, output: str | Path | None, spec: EvaluateSpec
) -> EvaluateRun:
    """Before any computation: the report never overwrites the data or the selection, and
    a folder named as a selection file is refused before the corpus is read."""
    out = evaluation_path(selection, output)
    check_writable(out)
    read = [input, selection, spec.given, spec.given_selection]
    check_no_overlap([out], [path for path in read if path is not None])
    summary = selection_summary(selection, what="--selection", then="evaluate it")
    if spec.given_selection is not None:  # as select reads it: a run's folder too
        selection_summary(spec.given_selection, what="--given-selection", then="evaluate")
    return EvaluateRun(spec, str(input), str(selection), out, summary)


def _verify(run: EvaluateRun) -> None:
    """The selection was made from this input (docs/provenance.md); the report says so."""
    if run.spec.trust_selection:
        if selection_record(run.selection) is None:
            warn_trust_unused(run.selection, "it holds no provenance record to check")
        return
    run.verified = verify_selection_file(run.selection, run.input, split=run.spec.split)


def _score(run: EvaluateRun) -> dict[str, Any]:
    """The corpus read, the selection matched to its rows and scored (``given`` too)."""
    spec = run.spec
    # the token budget its summary (a sharded run's manifest) records: kept, budget,
    # corpus, length_col; None for a document budget or a list of ids
    budget = (run.summary or {}).get("tokens")
    length_col = spec.length_col
    if length_col is None and budget is not None and budget.get("length_col"):
        names = input_column_names(run.input, split=spec.split)
        if budget["length_col"] in names:
            length_col = budget["length_col"]  # the tokens the budget counted
    corpus, columns = read_scored_corpus(
        run.input, spec.columns, split=spec.split, length_col=length_col
    )
    rows = read_selection(run.selection, corpus.ids, id_col=columns.id_col, folder=True)
    report = evaluate_selection(
        corpus,
        rows,
        algorithm=list(spec.objective.algorithm),
        lamb=spec.objective.lamb,
        length_col=length_col,
        device=spec.device,
        dup_thresholds=spec.dup_thresholds,
        dup_search=spec.dup_search,
        progress=spec.progress,
        budget_tokens=None if budget is None else budget.get("budget"),
    )
    report["selection"] = run.selection
    if budget is not None and report["length"] is not None:
        report["length"]["tokens"]["budget"] = budget.get("budget")
    if spec.given is not None:  # scored given KEPT, as `select --given` scores it
        kept = read_given(spec.given, columns, selection=spec.given_selection)
        report["given"] = evaluate_given(corpus, kept, rows, spec.objective, id_col=columns.id_col)
    return report


def read_scored_corpus(
    path: str | Path, columns: Columns, *, split: str | None = None, length_col: str | None = None
) -> tuple[Corpus, Columns]:
    """The corpus at ``path`` with ``columns`` (names not given: from the preset, else the
    schema), and those columns resolved (what the selection's ids are matched with); one
    length source is read too (``length_col``, else the first of ``LENGTH_COLUMNS``)."""
    sharded = is_sharded(path)
    here = sharded or Path(path).exists()
    names = input_column_names(str(path), split=split) if here else []
    columns = columns.resolve(names, where=str(path))
    if sharded:  # read whole: refused before reading where it would not fit
        _check_fits(path, columns.feature_col, split)
    extra: list[str] = []
    wanted = [length_col] if length_col else list(LENGTH_COLUMNS)
    if here:
        present = [c for c in wanted if c in names]
        if length_col and not present and names:
            raise ValueError(
                f"column {length_col!r} not found in {path}; available columns: {names}."
            )
        extra = present[:1]  # read one length source only (texts can be large)
    return read_input_corpus(path, columns, split=split, extra_cols=extra), columns


#: Bytes ``evaluate`` holds per embedding value of its input at its peak: 2.3 GB for
#: 200k x 384 (reading the shards whole 1.35 GB of it), measured on a sharded run's output.
EVALUATE_BYTES_PER_VALUE = 32


def _check_fits(path: Any, feature_col: str, split: str | None) -> None:
    """Refuse shards whose embeddings ``evaluate`` could not hold in the memory available
    (:data:`EVALUATE_BYTES_PER_VALUE`), before reading them."""
    free = available_bytes()
    if free is None:
        return
    rows, width = embedding_size(path, feature_col, split=split)
    need = rows * max(width, 1) * EVALUATE_BYTES_PER_VALUE
    if need > free:
        raise ValueError(
            f"{path} holds {rows:,} rows of {width}-d embeddings: about {_size(need)} to "
            f"evaluate whole, more than the {_size(free)} of memory available. Evaluate a "
            "sample of its shards, or read the J a sharded `datamask select` run computed "
            "over every document in its manifest.json."
        )


def _size(n_bytes: float) -> str:
    """A byte count as a message says it.

    >>> _size(3.2e9), _size(5e5)
    ('3.2 GB', '0.5 MB')
    """
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB"
