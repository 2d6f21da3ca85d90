"""A sharded run with object storage as its only medium, against the same run on local files.

    python benchmarks/storage/s3_inplace.py --corpus ../shared/data/realtext.parquet \
        --n-shards 8 --workers 2 --work /tmp/datamask-s3-bench

The corpus is cut into ``--n-shards`` shards of consecutive rows (row groups of 2,000),
uploaded to a moto S3 server on 127.0.0.1 (started here, in this process), and
``datamask select`` runs twice with the same flags and seed, each in its own process:
``local`` (local shards, local output) and ``s3`` (input, work dir and output all
``s3://``; nothing staged on the driver). Recorded per run: wall seconds, CPU seconds of
the run's processes (user + sys, its pool workers included), the driver's peak RSS and
the largest worker's (from the manifest), the load average before and after, and for
``s3`` the requests the S3 server answered, by method and by the folder they touched.
Moto is a Python server on the same 2 cores, so the s3 wall is an upper bound of what a
real object store costs. Rows append to ``results/2026-11-26-cpu2-s3-inplace.jsonl``; RESULTS.md is
written by hand from them.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
BUCKET = "dm-bench"
FLAGS = ["--select-ratio", "0.1", "--seed", "0", "--no-progress", "--runner", "local"]
FLAGS += ["--chunk-size", "7100"]  # about 8 k-means groups of the 56k real-text corpus
_LINE = re.compile(r'"(?P<method>[A-Z]+) /(?P<path>[^ ?]*)(?P<query>\?[^ ]*)? HTTP')


class _Requests(logging.Handler):
    """Counts the S3 server's requests (werkzeug's access log) by method and folder."""

    def __init__(self) -> None:
        super().__init__()
        self.by_method: Counter[str] = Counter()
        self.by_folder: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        m = _LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))  # colours
        if not m:
            return
        query = m["query"] or ""
        kind = "LIST" if "list-type" in query else m["method"]
        kind += " (upload part)" if "partNumber" in query else ""
        self.by_method[kind] += 1
        parts = m["path"].split("/")[1:]  # without the bucket
        if parts[:1] == ["in"]:
            folder = "input"
        elif len(parts) > 2 and parts[1] == "_work":
            folder = "work/" + parts[2]
        elif len(parts) > 2:
            folder = "out/" + parts[1]
        elif len(parts) == 2 and parts[1]:
            folder = "out (manifest)"
        else:
            folder = "bucket"
        self.by_folder[folder] += 1


def _shards(corpus: Path, n: int, folder: Path) -> None:
    table = pq.read_table(corpus)
    step = -(-table.num_rows // n)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        part = table.slice(i * step, step)
        pq.write_table(part, folder / f"part-{i:03d}.parquet", row_group_size=2000)


def _run(name: str, inp: str, out: str, workers: int, env: dict[str, str], cwd: Path) -> dict:
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", inp, "--output", out]
    cmd += ["--workers", str(workers), *FLAGS]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return {
        "run": name,
        "wall_s": round(wall, 2),
        "cpu_user_s": round(after.ru_utime - before.ru_utime, 2),
        "cpu_sys_s": round(after.ru_stime - before.ru_stime, 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", type=Path, default=HERE.parents[2] / "shared/data/realtext.parquet"
    )
    parser.add_argument("--n-shards", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/datamask-s3-bench"))
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    shutil.rmtree(args.work, ignore_errors=True)
    # in a process of its own: the runs below are started from this one, and a child
    # inherits its parent's peak RSS (ru_maxrss survives exec), which the corpus would set
    cut = multiprocessing.get_context("spawn").Process(
        target=_shards, args=(args.corpus, args.n_shards, args.work / "shards")
    )
    cut.start()
    cut.join()
    requests = _Requests()  # before the server starts: werkzeug then prints nothing
    logging.getLogger("werkzeug").addHandler(requests)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    storage = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    client = boto3.client("s3", endpoint_url=storage["AWS_ENDPOINT_URL"], **{
        "aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"
    })  # fmt: skip
    client.create_bucket(Bucket=BUCKET)
    for f in sorted((args.work / "shards").iterdir()):
        client.upload_file(str(f), BUCKET, f"in/{f.name}")

    driver = args.work / "driver"
    driver.mkdir()
    env = {**os.environ, **storage, "DATAMASK_CACHE": str(driver / "cache")}
    # the runs start in the driver's folder: a relative PYTHONPATH would import another copy
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in path if p)
    rows = [_run("local", str(args.work / "shards"), str(args.work / "local-out"), args.workers,
                 env, driver)]  # fmt: skip
    requests.by_method.clear()
    requests.by_folder.clear()
    rows.append(_run("s3", f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out", args.workers, env, driver))
    rows[-1]["requests"] = dict(sorted(requests.by_method.items()))
    rows[-1]["requests_by_folder"] = dict(sorted(requests.by_folder.items()))
    local_files = [str(p) for p in driver.rglob("*") if p.suffix in (".parquet", ".npz", ".npy")]
    rows[-1]["data_files_on_driver"] = local_files

    manifests = [
        json.loads((args.work / "local-out" / "manifest.json").read_text()),
        json.loads(client.get_object(Bucket=BUCKET, Key="out/manifest.json")["Body"].read()),
    ]
    selections = []
    import datamask

    for row, manifest in zip(rows, manifests, strict=True):
        row["datamask"] = str(Path(datamask.__file__).parent)
        totals = manifest["totals"]
        row["driver_peak_rss_mb"] = totals["driver_peak_rss_mb"]
        row["worker_peak_rss_mb"] = manifest["summary"]["peak_rss_mb_per_worker"]
        row["seconds"] = {k: v for k, v in totals["seconds"].items() if v is not None}
        row["n_docs"], row["k"], row["n_groups"] = totals["n_docs"], totals["k"], totals["n_groups"]
        selections.append(manifest["selection_digest"])
    for row in rows:
        row["same_selection"] = selections[0] == selections[1]
        row["corpus"] = args.corpus.name
        row["n_shards"], row["workers"] = args.n_shards, args.workers
    server.stop()
    with open(HERE / "results" / "2026-11-26-cpu2-s3-inplace.jsonl", "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
