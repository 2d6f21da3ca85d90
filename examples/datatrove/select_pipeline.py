"""datamask inside a datatrove pipeline: features -> select (one rank per group) -> filter.

    pip install "datamask[datatrove,embed]"
    python examples/datatrove/select_pipeline.py --input SHARDS/ --work out/ --tasks 4 \\
        --groups 2 --select-ratio 0.1 --precomputed

Three ``LocalPipelineExecutor`` stages chained with ``depends=``; running the last runs the
others first, and a rerun skips the tasks whose ``logs/*/completions/{rank:05d}`` exist.

1. features (``--tasks`` T): ``ParquetReader`` -> ``DatamaskFeatures`` writes
   ``work/features/{rank:05d}.parquet``. With ``--precomputed`` the embedding and quality
   come from the input's ``feature_arr`` and ``quality_score`` columns (datatrove puts
   extra columns in the document metadata); without it they are computed from the text
   (all-MiniLM-L6-v2 and the heuristic of ``datamask.quality``).
2. select (``--groups`` G): rank g selects ``round(select_ratio * n_g)`` documents of the
   feature files ``[g::G]``; writes ``work/selection/``.
3. filter (T tasks, same reader, so each rank loads only its own keep list):
   ``ParquetReader`` -> ``DatamaskFilter`` -> ``ParquetWriter`` writes the kept documents,
   every column, to ``work/output/``; the dropped ones go to ``work/removed/`` with
   ``--removed``.

The input is a folder of parquet files with ``text`` and an id column (``--id-key``,
default ``chunk_id``), such as ``examples/demo/demo_docs.parquet`` split into shards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.writers import ParquetWriter

from datamask.integrations.datatrove import DatamaskFeatures, DatamaskFilter, DatamaskSelect


def build(args: argparse.Namespace) -> LocalPipelineExecutor:
    """The three stages; the returned (last) one runs the others through ``depends=``."""
    work = Path(args.work)

    def reader() -> ParquetReader:
        return ParquetReader(str(args.input), text_key="text", id_key=args.id_key)

    features = LocalPipelineExecutor(
        pipeline=[
            reader(),
            DatamaskFeatures(
                str(work / "features"),
                embedding_key="feature_arr" if args.precomputed else None,
                quality_key="quality_score" if args.precomputed else None,
            ),
        ],
        tasks=args.tasks,
        workers=args.workers,
        logging_dir=str(work / "logs" / "features"),
    )
    select = LocalPipelineExecutor(
        pipeline=[
            DatamaskSelect(
                str(work / "features"),
                str(work / "selection"),
                select_ratio=args.select_ratio,
                lamb=args.lamb,
                seed=args.seed,
            )
        ],
        tasks=args.groups,
        workers=args.workers,
        logging_dir=str(work / "logs" / "select"),
        depends=features,
    )
    removed = ParquetWriter(str(work / "removed")) if args.removed else None
    return LocalPipelineExecutor(
        pipeline=[
            reader(),
            DatamaskFilter(str(work / "selection"), exclusion_writer=removed),
            ParquetWriter(str(work / "output")),
        ],
        tasks=args.tasks,
        workers=args.workers,
        logging_dir=str(work / "logs" / "filter"),
        depends=select,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="folder of parquet shards")
    p.add_argument("--work", required=True, help="output folder (features, selection, output)")
    p.add_argument("--id-key", default="chunk_id", help="id column (default: chunk_id)")
    p.add_argument("--tasks", type=int, default=4, help="tasks of features/filter (default: 4)")
    p.add_argument("--groups", type=int, default=1, help="selection groups (default: 1)")
    p.add_argument("--workers", type=int, default=1, help="processes at once (default: 1)")
    p.add_argument("--select-ratio", type=float, default=0.1, help="kept fraction (default: 0.1)")
    p.add_argument("--lamb", type=float, default=0.5, help="quality weight (default: 0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument(
        "--precomputed",
        action="store_true",
        help="take feature_arr and quality_score from the input instead of computing them",
    )
    p.add_argument("--removed", action="store_true", help="also write the dropped documents")
    args = p.parse_args(argv)
    build(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
