"""datamask inside a NeMo Curator pipeline, on CPU: read -> (pre-embedded) -> datamask
selection -> Curator's removal -> write.

    pip install torch==2.13.0 -e ".[curator]"
    python examples/curator/curator_pipeline.py --input examples/demo/demo_docs.parquet \\
        --work out/curator --select-ratio 0.1

1. The corpus: ``--input`` split into ``--shards`` parquet files (``WORK/raw/``), as a
   user's text corpus would be.
2. Curator pipeline (Ray Data): ``ParquetReader`` -> :class:`PreEmbedded` ->
   ``ParquetWriter`` writes ``WORK/embeddings/``. The demo already holds MiniLM embeddings
   and a quality score; :class:`PreEmbedded` only gives them the names and types
   Curator's embedding stage and FineWeb-Edu classifier write (``embeddings``, a list of
   floats; ``fineweb-edu-score-float``). With a GPU, put Curator's own embedder here.
3. :class:`~datamask.integrations.curator.DatamaskSelectionWorkflow` (Xenna, Curator's
   default executor): keeps ``round(select_ratio * N)`` documents; writes
   ``WORK/datamask/selection/`` and ``WORK/datamask/ids_to_remove/``.
4. Curator's ``TextDuplicatesRemovalWorkflow`` (Ray Data) drops those ids from the raw
   shards and writes the kept documents, every column, to ``WORK/kept/``.

Without ``RAY_ADDRESS`` a local Ray is started for the run (``--cpus``, default: this
machine's) and stopped at the end; with it, the executors use that cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from nemo_curator.backends.ray_data import RayDataExecutor
from nemo_curator.backends.xenna import XennaExecutor
from nemo_curator.pipeline import Pipeline
from nemo_curator.stages.base import ProcessingStage
from nemo_curator.stages.text.deduplication.removal_workflow import (
    TextDuplicatesRemovalWorkflow,
)
from nemo_curator.stages.text.io.reader import ParquetReader
from nemo_curator.stages.text.io.writer import ParquetWriter
from nemo_curator.tasks import DocumentBatch

from datamask.integrations.curator import DatamaskSelectionWorkflow, local_ray_cluster


@dataclass
class PreEmbedded(ProcessingStage[DocumentBatch, DocumentBatch]):
    """``embedding`` -> ``embeddings`` as Curator's embedders write it (``tolist()`` of a
    float32 matrix: a list of floats per row); ``quality_score`` ->
    ``fineweb-edu-score-float``, the column of Curator's FineWeb-Edu classifier."""

    name: str = "pre_embedded"
    embedding_field: str = "embedding"

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas()
        matrix = np.stack(df[self.embedding_field].to_numpy()).astype(np.float32)
        df = df.drop(columns=[self.embedding_field]).assign(
            embeddings=matrix.tolist(),
            **{"fineweb-edu-score-float": df["quality_score"].astype("float32")},
        )
        return DocumentBatch(
            dataset_name=task.dataset_name, data=df, _metadata=task._metadata,
            _stage_perf=task._stage_perf,
        )  # fmt: skip


def split_corpus(source: Path, folder: Path, shards: int) -> int:
    """``source`` as ``shards`` parquet files in ``folder``; returns the row count."""
    table = pq.read_table(source)
    folder.mkdir(parents=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for i in range(shards):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        pq.write_table(part, folder / f"part-{i:05d}.parquet")
    return table.num_rows


def write_embeddings(raw: Path, out: Path, id_field: str, embedding_field: str) -> None:
    """Step 2: a Curator pipeline writes the embedding files with its own writer."""
    pipeline = Pipeline(name="embed", description="pre-embedded documents, Curator's layout")
    pipeline.add_stage(ParquetReader(file_paths=str(raw), files_per_partition=1))
    pipeline.add_stage(PreEmbedded(embedding_field=embedding_field))
    fields = [id_field, "embeddings", "fineweb-edu-score-float"]
    pipeline.add_stage(ParquetWriter(path=str(out), fields=fields))
    pipeline.run(RayDataExecutor())


def run(args: argparse.Namespace) -> dict:
    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    started = time.perf_counter()
    n = split_corpus(Path(args.input), work / "raw", args.shards)
    cluster = nullcontext() if os.environ.get("RAY_ADDRESS") else local_ray_cluster(args.cpus)
    with cluster:
        write_embeddings(work / "raw", work / "embeddings", args.id_field, args.embedding_field)
        selection = DatamaskSelectionWorkflow(
            input_path=str(work / "embeddings"), output_path=str(work / "datamask"),
            id_field=args.id_field, select_ratio=args.select_ratio, seed=args.seed,
            workers=args.cpus,
        ).run(XennaExecutor(config={"cpu_allocation_percentage": 1.0}))  # fmt: skip
        meta = selection.metadata
        TextDuplicatesRemovalWorkflow(
            input_path=str(work / "raw"), ids_to_remove_path=meta["ids_to_remove_path"],
            output_path=str(work / "kept"), id_field=args.id_field,
            input_files_per_partition=1,
        ).run(RayDataExecutor())  # fmt: skip
    kept = pq.read_table(work / "kept", columns=[args.id_field]).num_rows
    summary = {
        "documents": n,
        "selected": meta["n_selected"],
        "removed": meta["n_removed"],
        "kept_rows_written": kept,
        "kept": str(work / "kept"),
        "executor": meta["executor"],
        "steps": sorted({p["step"] for p in meta["pipelines"]}),
        "selection_seconds": round(meta["seconds"]["total"], 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    default_input = Path(__file__).resolve().parents[1] / "demo" / "demo_docs.parquet"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default=str(default_input),
                        help="parquet: an id, text, quality_score and an embedding column "
                        "(default: the shipped demo)")  # fmt: skip
    parser.add_argument("--work", default="out/curator", help="output folder (replaced)")
    parser.add_argument("--shards", type=int, default=4, help="raw shards (default 4)")
    parser.add_argument("--select-ratio", type=float, default=0.1, help="default 0.1")
    parser.add_argument("--seed", type=int, default=0, help="default 0")
    parser.add_argument("--id-field", default="chunk_id", help="id column (default chunk_id)")
    parser.add_argument("--embedding-field", default="feature_arr",
                        help="the input's embedding column (default feature_arr)")  # fmt: skip
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                        help="CPUs of the local Ray and steps at once (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    summary = run(args)
    return 0 if summary["kept_rows_written"] == summary["selected"] else 1


if __name__ == "__main__":
    sys.exit(main())
