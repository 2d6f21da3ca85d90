"""A Curator stage for the tests and the example: pre-embedded documents as Curator's own
stages leave them (module-level, so Ray workers import it by name)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nemo_curator.stages.base import ProcessingStage
from nemo_curator.tasks import DocumentBatch


@dataclass
class PreEmbedded(ProcessingStage[DocumentBatch, DocumentBatch]):
    """``embedding`` -> ``embeddings`` as Curator's embedders write it (``tolist()`` of a
    float32 matrix: a list of doubles per row) and ``quality_score`` ->
    ``fineweb-edu-score-float``, the FineWeb-Edu classifier's score column."""

    name: str = "pre_embedded"

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas()
        matrix = np.stack(df["embedding"].to_numpy()).astype(np.float32)
        df = df.drop(columns=["embedding"]).assign(
            embeddings=matrix.tolist(),
            **{"fineweb-edu-score-float": df["quality_score"].astype("float32")},
        )
        return DocumentBatch(
            dataset_name=task.dataset_name, data=df, _metadata=task._metadata,
            _stage_perf=task._stage_perf,
        )  # fmt: skip
