"""The sharded engine's outputs, byte for byte, against digests recorded before the rebuild.

The engine was rebuilt around one step contract (``distributed/engine.py``); its outputs
must not change for the same seed. Each case runs a small sharded selection in this
process (``LocalRunner()``: the pool and Ray give the same bytes, as
``test_identical_across_worker_counts_and_runners`` and the cluster tests check) and
hashes every table the run publishes: the selected parts, the cover, the keep lists,
and the manifest's totals. The digests were taken at a746bdc, before the rebuild; a
change that alters them changes a selection and must say so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask import make_clustered
from datamask.config import SelectSpec
from datamask.distributed import run_selection
from tests._data import reference_table, write, write_corpus_shards

N_SHARDS, ROWS, DIM = 5, 240, 12
FAST = dict(n_epochs=15, select_ratio=0.11, n_neighbors=12)

CASES = {
    # clusters, budget allocated by gains, the exchange round, the cover, keep lists
    "gains": dict(partition="cluster", n_clusters=5, chunk_size=300),
    # a budget per group, with the similarity cap across groups
    "group-cap": dict(partition="chunk", chunk_size=400, budget="group", max_similarity=0.97),
    # the central round of a method that is not modular, over chunk candidates
    "central": dict(partition="chunk", chunk_size=400, method="greedy", lamb=0.3),
    # a modular method: the exact merge of scores
    "topk": dict(partition="shard", method="topk"),
    # selected only: no cover, no ranked rows
    "selected-only": dict(partition="shard", selected_only=True),
    # given KEPT: floors, the union's rate, the cover above KEPT
    "given": dict(partition="cluster", n_clusters=3, chunk_size=600, given="KEPT"),
}


#: Columns of the learner's own numbers (its logits, and what follows from them): the
#: selection does not depend on their last bits, the full digest does.
SCORES = {"logit", "probability", "score", "gain", "covered_sim"}


def _digest(out: Path, *, scores: bool = True) -> str:
    """One hash of every table the run published (sorted by file name, rows as written)
    and of the manifest's totals and budget; without the score columns, the selection's."""
    h = hashlib.sha256()
    for folder in ("selected", "covered", "keep"):
        for f in sorted((out / folder).rglob("*.parquet")) if (out / folder).exists() else []:
            h.update(str(f.relative_to(out)).encode())
            t = pq.read_table(f)
            if not scores:
                t = t.drop_columns([c for c in t.column_names if c in SCORES])
            h.update(repr(t.schema.names).encode())
            for col in t.columns:
                h.update(repr(col.to_pylist()).encode())
    manifest = json.loads((out / "manifest.json").read_text())
    h.update(json.dumps(manifest["totals"]["k"]).encode())
    h.update(json.dumps([g["k"] for g in manifest["groups"]]).encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    write_corpus_shards(root / "in", make_clustered(N_SHARDS * ROWS, DIM, 7, seed=3), N_SHARDS)
    kept = make_clustered(150, DIM, 3, seed=9)
    ids = [f"kept-{i}" for i in range(150)]
    table = reference_table(ids, kept.quality[:, 0], kept.features.astype(np.float32))
    write(table, root / "kept.parquet")
    return root


def _spec(case: str, root: Path) -> SelectSpec:
    settings = {**FAST, **CASES[case]}
    if settings.get("given") == "KEPT":
        settings["given"] = str(root / "kept.parquet")
    return SelectSpec.from_mapping(settings)


#: The selection (every published column but the scores), recorded at a746bdc before the
#: step contract: the engine, the storage layer and the learner's sync-free epoch left it
#: unchanged.
SELECTION = {
    "central": "6eadbc964431bfb4",
    "gains": "6df741a2a415f16c",
    "given": "bb490030d7cb50f7",
    "group-cap": "0bfc77040c9e37b5",
    "selected-only": "63e257bfee8ddc0e",
    "topk": "3b93ca5c45f274b3",
}

#: Every published byte, scores included. Recorded at a746bdc and unchanged by the engine
#: rebuild; re-recorded when the learner's epoch lost its host syncs (learner-epoch merge):
#: its logits differ in the last bits, its selections do not (SELECTION). "gains"
#: re-recorded when the cover read each row's own group from the saved graph: that
#: route's ``covered_sim`` is the pair's row-wise dot product, not a matmul's, and
#: differs in the last bit (``covered_by`` and ``covered_exact`` are SELECTION's, unchanged).
#: "group-cap" and "central" re-recorded for the same reason when every group whose
#: graph no other step saved (no exchange round) kept it for the cover
#: (``select/graphs.py``): 1.8e-7 at most.
GOLDEN = {
    "central": "96ba2bf743551b59",
    "gains": "56e89406a1745956",
    "given": "6c0bc591fe1fcf94",
    "group-cap": "a2724522724dfcb9",
    "selected-only": "49cd87d25873af94",
    "topk": "8d8623f16f6989e3",
}


@pytest.mark.filterwarnings("ignore:n_epochs is not a parameter")
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_unchanged_by_the_engine(case, shards, tmp_path):
    run_selection(shards / "in", tmp_path / "out", _spec(case, shards), progress=False)
    assert _digest(tmp_path / "out", scores=False) == SELECTION[case]
    assert _digest(tmp_path / "out") == GOLDEN[case]
