"""datatrove pipeline steps: write features, select one group per rank, filter documents.

Three steps, run as three ``LocalPipelineExecutor`` stages chained with ``depends=`` (see
``examples/datatrove/select_pipeline.py``)::

    features = LocalPipelineExecutor(
        [ParquetReader(INPUT), DatamaskFeatures(WORK + "/features")], tasks=T)
    select = LocalPipelineExecutor(
        [DatamaskSelect(WORK + "/features", WORK + "/selection", select_ratio=0.1)],
        tasks=G, depends=features)
    keep = LocalPipelineExecutor(
        [ParquetReader(INPUT), DatamaskFilter(WORK + "/selection"), ParquetWriter(OUT)],
        tasks=T, depends=select)
    keep.run()

* :class:`DatamaskFeatures` writes ``features/{rank:05d}.parquet`` (``chunk_id`` = the
  document's id, ``quality_score``, ``feature_arr``): the embedding and quality are read
  from the document's metadata when named, else computed (the bundled MiniLM model; the
  text heuristic of :mod:`datamask.quality`). Documents pass through unchanged.
* :class:`DatamaskSelect`: rank ``g`` of ``G`` selects within group ``g``, the feature
  files ``[g::G]``, with datamask's selector (:func:`datamask.select_table`). It writes
  ``groups/{g:05d}.parquet`` (every id with ``selected``, ``logit``, ``rank``) and, per
  feature file, the kept ids as ``keep/{rank:05d}.parquet``.
* :class:`DatamaskFilter` keeps the selected documents. When it runs with the task count
  of the features stage over the same input (so rank r sees the documents that feature
  rank r saw), it loads only its own keep list; otherwise every keep list.

Folders may be local paths or any datatrove ``DataFolder`` (``s3://...``); local files are
written atomically (a hidden temporary, then a rename). datatrove is an optional
dependency: ``pip install datamask[datatrove]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

try:
    from datatrove.data import Document, DocumentsPipeline
    from datatrove.io import DataFolderLike, get_datafolder
    from datatrove.pipeline.base import PipelineStep
    from datatrove.pipeline.filters.base_filter import BaseFilter
    from datatrove.pipeline.writers.disk_base import DiskWriter
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "Please install `datatrove` to use datamask.integrations.datatrove "
        "(`pip install datamask[datatrove]`)."
    ) from exc

from .._validation import check_count
from ..api import select_table
from ..config import SelectSpec
from ..distributed import group_seeds
from ..embedding import embed_texts
from ..io.atomic import atomic_write
from ..io.dictionary import dictionary_columns
from ..quality import heuristic_quality_batch

__all__ = ["DatamaskFeatures", "DatamaskSelect", "DatamaskFilter", "group_seed"]

#: Schema-metadata key recording the features stage's task count.
WORLD_SIZE_KEY = b"datamask.world_size"
_STEP_TYPE = "🎭 - DATAMASK"


def group_seed(seed: int, group: int, n_groups: int) -> int:
    """The seed of one group, as ``datamask select`` gives its groups
    (:func:`datamask.distributed.group_seeds`): ``seed`` itself for a single group, so a
    one-task run reproduces ``datamask select`` bit for bit; else group ``group`` of
    ``SeedSequence(seed).spawn(n_groups)``, as an int."""
    return group_seeds(seed, n_groups)[group]


@contextlib.contextmanager
def _sink(folder: Any, name: str) -> Iterator[Any]:
    """A place to write ``name`` in ``folder``: an atomic temporary locally, else a stream."""
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(folder.fs, LocalFileSystem):
        with atomic_write(folder.resolve_paths(name)) as tmp:
            yield tmp
    else:
        with folder.open(name, "wb") as fh:
            yield fh


def _write_table(folder: Any, name: str, table: pa.Table) -> None:
    with _sink(folder, name) as where:
        pq.write_table(
            table, where, compression="zstd", use_dictionary=dictionary_columns(table.schema)
        )


def _read_table(folder: Any, name: str) -> pa.Table:
    with folder.open(name, "rb") as fh:
        return pq.read_table(fh)


def _parquet_files(folder: Any, subdirectory: str = "") -> list[str]:
    if not folder.exists(subdirectory):
        return []
    files = folder.list_files(subdirectory, recursive=False, glob_pattern="*.parquet")
    return sorted(f for f in files if not f.rsplit("/", 1)[-1].startswith((".", "_")))


def _from_metadata(docs: list[Document], key: str, dtype: Any, hint: str) -> np.ndarray:
    """``doc.metadata[key]`` of every document as one array; the first document without
    the key is named, followed by ``hint``."""
    missing = next((d.id for d in docs if key not in d.metadata), None)
    if missing is not None:
        raise ValueError(f"document {missing!r} has no metadata key {key!r}; {hint}")
    return np.asarray([d.metadata[key] for d in docs], dtype=dtype)


class DatamaskFeatures(PipelineStep):
    """Write each document's id, quality and embedding to ``output_folder/{rank:05d}.parquet``.

    Documents pass through unchanged, so later steps (a writer, say) may follow.

    Parameters
    ----------
    output_folder : str or DataFolder
        Where the feature files go.
    embedding_key : str, optional
        Metadata key holding a precomputed embedding (a list of floats). None computes it
        from the text with :func:`datamask.embedding.embed_texts` (``model``, ``device``, ...).
    quality_key : str, optional
        Metadata key holding a numeric quality. None computes
        :func:`datamask.quality.heuristic_quality` of the text.
    model : str, optional
        Local sentence-transformers model directory (default: the bundled MiniLM).
    batch_size, max_seq_length, device
        As in :func:`datamask.embedding.embed_texts`.
    chunk_docs : int, default=1024
        Documents held, embedded and written at a time.
    length_key : str, optional
        Metadata key holding each document's token count (datatrove's ``TokensCounter``
        writes ``token_count``), written as ``n_tokens``; None writes the text's
        characters as ``n_chars``. What a token budget of :class:`DatamaskSelect`
        (``select_token_ratio=``, ``budget_tokens=``) counts.
    """

    name = "🎭 datamask features"
    type = _STEP_TYPE

    def __init__(
        self,
        output_folder: DataFolderLike,
        *,
        embedding_key: str | None = None,
        quality_key: str | None = None,
        model: str | None = None,
        batch_size: int = 64,
        max_seq_length: int = 256,
        device: str = "cpu",
        chunk_docs: int = 1024,
        length_key: str | None = None,
    ) -> None:
        super().__init__()
        check_count("chunk_docs", chunk_docs)
        self.length_key = length_key
        self.output_folder = get_datafolder(output_folder)
        self.embedding_key = embedding_key
        self.quality_key = quality_key
        self.model = model
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.device = device
        self.chunk_docs = chunk_docs

    def _table(self, docs: list[Document]) -> pa.Table:
        if self.embedding_key is None:
            emb = embed_texts(
                [d.text for d in docs],
                self.model,
                batch_size=self.batch_size,
                device=self.device,
                max_seq_length=self.max_seq_length,
                progress=False,
            )
        else:
            emb = _from_metadata(
                docs,
                self.embedding_key,
                np.float32,
                "drop embedding_key= to compute embeddings from the text.",
            )
        if self.quality_key is None:
            quality = heuristic_quality_batch(d.text for d in docs)
        else:
            quality = _from_metadata(
                docs, self.quality_key, np.float64, "drop quality_key= to use the text heuristic."
            )
        values = pa.array(np.ascontiguousarray(emb, dtype=np.float32).reshape(-1))
        if self.length_key is None:
            length = ("n_chars", pa.array([len(d.text) for d in docs], pa.int64()))
        else:
            hint = "drop length_key= to count the text's characters."
            counts = _from_metadata(docs, self.length_key, np.float64, hint)
            length = ("n_tokens", pa.array(counts))
        return pa.table(
            {
                "chunk_id": pa.array([str(d.id) for d in docs], pa.string()),
                "quality_score": pa.array(quality),
                "feature_arr": pa.FixedSizeListArray.from_arrays(values, emb.shape[1]),
                length[0]: length[1],
            }
        )

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data is None:
            return
        writer: pq.ParquetWriter | None = None
        with _sink(self.output_folder, f"{rank:05d}.parquet") as where:
            try:
                chunk: list[Document] = []
                for doc in data:
                    chunk.append(doc)
                    if len(chunk) < self.chunk_docs:
                        continue
                    writer = self._flush(chunk, writer, where, world_size)
                    yield from chunk
                    chunk = []
                if chunk or writer is None:
                    writer = self._flush(chunk, writer, where, world_size)
                    yield from chunk
            finally:
                if writer is not None:
                    writer.close()

    def _flush(
        self, docs: list[Document], writer: Any, where: Any, world_size: int
    ) -> pq.ParquetWriter:
        with self.track_time():
            table = self._table(docs) if docs else None
        if writer is None:
            schema = (
                table.schema
                if table is not None
                else pa.schema(
                    [
                        ("chunk_id", pa.string()),
                        ("quality_score", pa.float64()),
                        ("feature_arr", pa.list_(pa.float32())),
                    ]
                )
            )
            schema = schema.with_metadata({WORLD_SIZE_KEY: str(world_size).encode()})
            writer = pq.ParquetWriter(
                where, schema, compression="zstd", use_dictionary=dictionary_columns(schema)
            )
        if table is not None:
            writer.write_table(table.replace_schema_metadata(writer.schema.metadata))
            self.stat_update("features_written", value=table.num_rows)
        return writer


class DatamaskSelect(PipelineStep):
    """Select within one group of feature files per rank, with datamask's selector.

    Rank ``g`` of ``G`` tasks takes the feature files ``[g::G]`` (sorted), keeps
    ``round(select_ratio * n_g)`` of their documents and writes
    ``output_folder/groups/{g:05d}.parquet`` and ``output_folder/keep/<feature file>``
    (the kept ids of each feature file). A rank with no feature file does nothing.

    Parameters
    ----------
    features_folder : str or DataFolder
        The :class:`DatamaskFeatures` output.
    output_folder : str or DataFolder
        Where the selection goes (read by :class:`DatamaskFilter`).
    seed : int, default=0
        Group g uses :func:`group_seed` ``(seed, g, G)``: ``seed`` itself with one task.
    device : str, default="cpu"
        Datatrove's workers are CPU processes unless told otherwise.
    **settings
        Any setting of ``datamask select`` (``select_ratio``, ``lamb``, ``method``,
        ``algorithm``, ``max_similarity``, ``n_epochs``, ...), as in
        :func:`datamask.select_table`.
    """

    name = "🎭 datamask select"
    type = _STEP_TYPE

    def __init__(
        self,
        features_folder: DataFolderLike,
        output_folder: DataFolderLike,
        *,
        seed: int = 0,
        device: str = "cpu",
        **settings: Any,
    ) -> None:
        super().__init__()
        # checked now, on the driver, as `datamask select` checks them
        SelectSpec.from_mapping({**settings, "seed": seed, "device": device}, where=self.name)
        self.features_folder = get_datafolder(features_folder)
        self.output_folder = get_datafolder(output_folder)
        self.seed = seed
        self.device = device
        self.settings = settings

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        files = _parquet_files(self.features_folder)
        if not files and rank == 0:
            raise ValueError(
                f"no feature files in {self.features_folder.path!r}; run DatamaskFeatures first."
            )
        mine = files[rank::world_size]
        if not mine:
            return
        tables = [_read_table(self.features_folder, f) for f in mine]
        sizes = [t.num_rows for t in tables]
        if sum(sizes) == 0:
            return
        table = pa.concat_tables(t.replace_schema_metadata(None) for t in tables if t.num_rows)
        with self.track_time(unit="group"):
            selection = select_table(
                table,
                id_col="chunk_id",
                quality_col="quality_score",
                feature_col="feature_arr",
                seed=group_seed(self.seed, rank, world_size),
                device=self.device,
                **self.settings,
            )
        selected = selection["selected"].to_numpy(zero_copy_only=False)
        self.stat_update("documents", value=len(selected))
        self.stat_update("selected", value=int(selected.sum()))
        start = 0
        for f, n, t in zip(mine, sizes, tables, strict=True):
            kept = pa.table(
                {
                    "chunk_id": table["chunk_id"]
                    .slice(start, n)
                    .filter(pa.array(selected[start : start + n]))
                }
            )
            kept = kept.replace_schema_metadata(t.schema.metadata)  # the features' world size
            _write_table(self.output_folder, f"keep/{f.rsplit('/', 1)[-1]}", kept)
            start += n
        _write_table(
            self.output_folder, f"groups/{rank:05d}.parquet", selection.drop_columns(["row"])
        )


class DatamaskFilter(BaseFilter):
    """Keep the documents :class:`DatamaskSelect` selected (by ``Document.id``).

    Parameters
    ----------
    selection_folder : str or DataFolder
        The :class:`DatamaskSelect` output.
    exclusion_writer : DiskWriter, optional
        Receives the dropped documents (datatrove's usual filter option).
    per_rank : bool, default=True
        Load only ``keep/{rank:05d}.parquet`` when the features stage ran with this stage's
        task count (same input, same reader: rank r then sees feature rank r's documents).
        False, or another task count, loads every keep list.
    """

    name = "🎭 datamask filter"

    def __init__(
        self,
        selection_folder: DataFolderLike,
        *,
        exclusion_writer: DiskWriter | None = None,
        per_rank: bool = True,
    ) -> None:
        super().__init__(exclusion_writer)
        self.selection_folder = get_datafolder(selection_folder)
        self.per_rank = per_rank
        self._keep: set[str] | None = None

    def _load(self, rank: int, world_size: int) -> set[str]:
        files = _parquet_files(self.selection_folder, "keep")
        if not files:
            raise ValueError(
                f"no keep lists in {self.selection_folder.path!r}; run DatamaskSelect first."
            )
        own = f"keep/{rank:05d}.parquet"
        if self.per_rank and own in files:
            meta = pq.read_schema(self.selection_folder.open(own, "rb")).metadata or {}
            if meta.get(WORLD_SIZE_KEY) == str(world_size).encode():
                files = [own]
        keep: set[str] = set()
        for f in files:
            keep.update(_read_table(self.selection_folder, f)["chunk_id"].to_pylist())
        return keep

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        self._keep = self._load(rank, world_size)
        yield from super().run(data, rank, world_size)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if self._keep is None:  # filter() outside run(): load the lists of rank 0 of 1
            self._keep = self._load(0, 1)
        return True if str(doc.id) in self._keep else (False, "not_selected")
