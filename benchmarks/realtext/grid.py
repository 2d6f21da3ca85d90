"""What ``run.py`` runs on: its sets (``SET_NAMES``, ``load_set``) and objectives.

See ``run.py``'s docstring for where each set comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from datamask import Columns, make_clustered
from datamask.data import Corpus
from datamask.io.parquet import read_corpus

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SHARED = SHARED_DATA / "demo_docs.parquet"
# The shared copy of the corpus when there is one, else where build_corpus.py writes it.
DEFAULT_CORPUS = (
    SHARED_DATA / "realtext.parquet"
    if (SHARED_DATA / "realtext.parquet").exists()
    else HERE / "data" / "realtext.parquet"
)
SAMPLE_N, SAMPLE_SEED = 15_000, 0
OBJECTIVES = {
    "Facility": ["Facility"],
    "Pair_simi": ["Pair_simi"],
    "Facility+DiSF": ["Facility", "DiSF"],
}
SET_NAMES = ("realtext", "sample15k", "demo", "shared", "clustered")


def load_set(name: str, corpus_path: Path, clustered_n: int) -> Corpus | None:
    if name == "sample15k":
        full = load_set("realtext", corpus_path, clustered_n)
        if full is None:
            return None
        rng = np.random.default_rng(SAMPLE_SEED)
        rows = np.sort(rng.choice(full.n_docs, min(SAMPLE_N, full.n_docs), replace=False))
        sample = Corpus(
            ids=full.ids[rows],
            quality=full.quality[rows],
            features=full.features[rows],
            quality_names=full.quality_names,
            quality_weights=full.quality_weights,
        )
        sample.source = (
            f"{len(rows)} documents of the real-text corpus (numpy default_rng({SAMPLE_SEED}) "
            "sample without replacement)"
        )
        return sample
    if name == "realtext":
        if not corpus_path.exists():
            builder = HERE / "build_corpus.py"
            if not builder.exists():
                print(f"realtext: {corpus_path} missing and no {builder.name}; skipped")
                return None
            subprocess.run([sys.executable, str(builder), "--out", str(corpus_path)], check=True)
        corpus = read_corpus(corpus_path)
        meta = pq.read_schema(corpus_path).metadata or {}
        info = json.loads(meta.get(b"datamask.realtext", b"{}"))
        if info.get("partial"):
            corpus.source = (
                f"real-text corpus, partial snapshot: {corpus.n_docs} of "
                f"{info.get('rows_total')} documents (a uniform random sample)"
            )
        else:
            corpus.source = "real-text corpus (benchmarks/realtext/build_corpus.py)"
        return corpus
    if name == "demo":
        return read_corpus(ROOT / "examples" / "demo" / "demo_docs.parquet")
    if name == "shared":
        if not SHARED.exists():
            print(f"shared: {SHARED} missing; skipped")
            return None
        return read_corpus(SHARED, Columns(id_col="id", feature_col="embedding"))
    corpus = make_clustered(clustered_n, 384, 50, seed=0)
    corpus.source = f"make_clustered({clustered_n}, 384, 50, seed=0)"
    return corpus


def unit_features(corpus: Corpus) -> Corpus:
    """Scale the embeddings to unit length in place (norms in float64), as every fit does:
    the graphs built here, outside a fit, need them so. Returns the corpus."""
    x = np.asarray(corpus.features)
    norms = np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    corpus.features = np.ascontiguousarray(x / norms, dtype=np.float32)
    return corpus
