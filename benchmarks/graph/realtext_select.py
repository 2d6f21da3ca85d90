"""One selection of the real-text corpus at 10% (library defaults, 1 thread): its summary's
graph (method, K, sampled recall, seconds), exact J and the selected rows' digest, as JSON.

    PYTHONPATH=src python benchmarks/graph/realtext_select.py \
        --corpus ../shared/data/realtext.parquet
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

import datamask
from datamask import select


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True, help="the real-text parquet file")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    args = p.parse_args()
    load = os.getloadavg()
    started, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sel.parquet"
        summary = select(args.corpus, out, select_ratio=0.1, threads=args.threads, progress=False)
        table = pq.read_table(out, columns=["chunk_id", "selected"])
        # the output lists every row (``selected`` says which are kept): digest the kept ones
        ids = table.filter(table.column("selected")).column(0).to_pylist()
    print(
        json.dumps(
            {
                "code": str(Path(datamask.__file__).parent),
                "wall": time.perf_counter() - started,
                "cpu": time.process_time() - cpu,
                "load_before": load,
                "summary": summary,
                "selected_digest": hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest(),
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
