"""Requests and bytes per phase of a sharded select s3 -> s3, counted at the S3 server.

    flock -x /work/cpu.lock python benchmarks/storage/s3_phases.py \
        --out benchmarks/storage/results/2026-11-26-cpu2-s3-phases.jsonl  # S = 20, 100, 400
    python benchmarks/storage/s3_phases.py --one 100              # a single point

At a fixed corpus (``--n-docs`` documents of :func:`datamask.make_clustered`, ``--dim``
wide), cut into S shards of randomly drawn rows (so every cluster has rows in most
shards, the gather's worst case), each point runs ``datamask.select`` with input, work
dir and output all ``s3://`` on a moto S3 server started in the point's own process
(werkzeug, threaded, on 127.0.0.1), with a two-process :class:`~datamask.distributed.
LocalRunner`, the default global budget (gains, exchange round, cover) and keep lists.

Attribution. Every request is counted by a WSGI middleware in front of moto: its verb
(GET ranged / GET whole / HEAD / LIST / PUT / COPY / upload part / multipart create /
complete / DELETE), the bytes of its body (in) and of the response (out), the object
key, and the **phase**: the runner given to ``select`` names each ``map`` call by its
step (``ScanShard`` -> validation, ``BucketRepeats`` -> ids, ``FitPartition``,
``spill_shard``, ``index_spills``, ``gather_group``, ``select_group``, ...). The driver's
phases run one after another and each ``map`` ends before the next starts, so every
request arriving while a ``map`` is open is that phase's (its steps', or the driver's
own marker listing for it); requests between two maps are the driver's, reported as
``driver after <phase>`` (the last of them is the manifest).

Per group step (the ``SelectGroup`` phase): objects opened (distinct keys GET or HEAD
naming the group's number, plus keys naming no group read in that phase, divided by the
steps), requests and bytes, and the read seconds each step's completion marker records
(``seconds.read``: the group's rows from S3 into a Corpus).

Moto is a Python server sharing the 2 cores with the run, so seconds are an upper bound;
the counts are what any S3 server would see. Rows append to ``--out``; RESULTS.md is
written by hand from them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

SHARDS = (20, 100, 400)
BUCKET = "dm-phases"
_GID = re.compile(r"(?:group-|completions/|candidates/|cover/|exchange/|graphs/)(\d{5})")
PHASE = {"name": "driver (start)"}
STEPS: Counter[str] = Counter()  # steps per phase (items of its map calls)
SECONDS: Counter[str] = Counter()  # wall seconds per phase (driver gaps included)
_SINCE = [time.perf_counter()]


def _enter(name: str) -> None:
    """The phase is now ``name``: the one before it ends here."""
    now = time.perf_counter()
    SECONDS[PHASE["name"]] += now - _SINCE[0]
    PHASE["name"], _SINCE[0] = name, now


# --- counting in front of moto ----------------------------------------------------------------
def _verb(environ: dict[str, Any]) -> str:
    method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
    if method == "GET":
        if "list-type" in query or environ.get("PATH_INFO", "").count("/") <= 1:
            return "LIST"
        return "GET ranged" if environ.get("HTTP_RANGE") else "GET whole"
    if method == "PUT":
        if "partNumber" in query:
            return "upload part"
        return "COPY" if environ.get("HTTP_X_AMZ_COPY_SOURCE") else "PUT"
    if method == "POST":
        if "uploads" in query:
            return "multipart create"
        if "uploadId" in query:
            return "multipart complete"
        return "POST delete" if "delete" in query else "POST"
    return method  # HEAD, DELETE


class _Body:
    """``wsgi.input`` counting the bytes moto reads."""

    def __init__(self, raw: Any, tally: list[int]) -> None:
        self.raw, self.tally = raw, tally

    def read(self, *args: Any) -> bytes:
        data = self.raw.read(*args)
        self.tally[0] += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.raw.readline(*args)
        self.tally[0] += len(data)
        return data

    def __iter__(self) -> Any:
        return iter(self.readline, b"")


class Counting:
    """WSGI middleware: one record per request (phase, verb, key, bytes in, bytes out)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.records: list[tuple[str, str, str, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        phase, verb = PHASE["name"], _verb(environ)
        key = environ.get("PATH_INFO", "").split("/", 2)[-1] if verb != "LIST" else "(list)"
        tally = [0]
        environ["wsgi.input"] = _Body(environ["wsgi.input"], tally)
        out = 0
        for chunk in self.app(environ, start_response):
            out += len(chunk)
            yield chunk
        with self.lock:
            self.records.append((phase, verb, key, tally[0], out))


def start_s3() -> tuple[Any, Counting, str]:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    counting = Counting(DomainDispatcherApplication(create_backend_app))
    from moto.moto_server.threaded_moto_server import MotoRequestHandler

    server = make_server(
        "127.0.0.1", 0, counting, threaded=True, request_handler=MotoRequestHandler
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, counting, f"http://127.0.0.1:{server.server_address[1]}"


def phase_runner(workers: int) -> Any:
    """A LocalRunner that names the phase of every request by its ``map``'s step."""
    from datamask.distributed import LocalRunner, Step

    class PhaseRunner(LocalRunner):
        def map(self, fn: Any, items: Any, **kwargs: Any) -> Any:
            jobs = list(items)
            # a step of the engine (run_steps maps (step, index, job)): its class names it
            engine_step = jobs and isinstance(jobs[0][0], Step)
            name = type(jobs[0][0]).__name__ if engine_step else fn.__name__
            _enter(name)
            STEPS[name] += len(jobs)
            try:
                yield from super().map(fn, jobs, **kwargs)
            finally:
                _enter(f"driver after {name}")

    return PhaseRunner(workers)


# --- one point ------------------------------------------------------------------------------
def _put_shards(fs: Any, n_docs: int, dim: int, shards: int) -> None:
    from datamask import make_clustered

    corpus = make_clustered(n_docs, dim, 50, seed=0)
    x = np.asarray(corpus.features, dtype=np.float32)
    order = np.random.default_rng(0).permutation(n_docs)  # random rows per shard
    ids = np.asarray(corpus.ids)[order]
    q = np.asarray(corpus.quality, dtype=np.float64).reshape(n_docs, -1)[order, 0]
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x[order].reshape(-1)), dim)
    table = pa.table({"chunk_id": ids, "quality_score": q, "feature_arr": feats})
    for s, rows in enumerate(np.array_split(np.arange(n_docs), shards)):
        with fs.open_output_stream(f"{BUCKET}/in/part-{s:05d}.parquet") as fh:
            pq.write_table(table.take(pa.array(rows)), fh)


def _summarise(records: list[tuple[str, str, str, int, int]]) -> dict[str, Any]:
    phases: dict[str, dict[str, Any]] = {}
    for phase, verb, key, got, sent in records:
        p = phases.setdefault(
            phase, {"requests": 0, "verbs": Counter(), "in": 0, "out": 0, "read": set()}
        )
        p["requests"] += 1
        p["verbs"][verb] += 1
        p["in"] += got
        p["out"] += sent
        if verb in ("GET ranged", "GET whole"):
            p["read"].add(key)
    return {
        k: {
            **v,
            "verbs": dict(v["verbs"]),
            "read": len(v["read"]),
            "steps": STEPS.get(k, 0),
            "seconds": round(SECONDS.get(k, 0.0), 2),
        }
        for k, v in phases.items()
    }


def _group_steps(records: list, markers: list[dict]) -> dict[str, Any]:
    """Objects, requests and bytes per group step of the select phase; read seconds."""
    mine = [r for r in records if r[0] == "SelectGroup"]
    by_group: dict[int, set[str]] = defaultdict(set)
    shared: set[str] = set()
    for _, verb, key, _, _ in mine:
        if verb not in ("GET ranged", "GET whole", "HEAD"):
            continue
        m = _GID.search(key)
        (by_group[int(m[1])] if m else shared).add(key)
    opened = [len(keys) for keys in by_group.values()] or [0]
    reads = np.asarray([m["seconds"]["read"] for m in markers])
    steps = max(1, len(markers))
    return {
        "group_steps": len(markers),
        "objects_per_step_own_max": int(max(opened)),
        "objects_per_step_own_mean": round(float(np.mean(opened)), 2),
        "objects_read_shared": sorted(shared),
        "spills_read_in_select": sum(1 for r in mine if "clusters/shard-" in r[2]),
        "requests_per_step": round(len(mine) / steps, 1),
        "bytes_out_per_step": int(sum(r[4] for r in mine) / steps),
        "read_s_mean": round(float(reads.mean()), 4) if len(reads) else None,
        "read_s_max": round(float(reads.max()), 4) if len(reads) else None,
    }


def one_point(shards: int, n_docs: int, dim: int, workers: int) -> dict[str, Any]:
    server, counting, endpoint = start_s3()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}  # fmt: skip
    os.environ.update(env)  # the pool's workers inherit them
    os.environ["DATAMASK_CACHE"] = tempfile.mkdtemp(prefix="datamask-phases-cache-")
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="bench",
                           secret_key="bench", region="us-east-1",
                           allow_bucket_creation=True)  # fmt: skip
    fs.create_dir(BUCKET)
    _put_shards(fs, n_docs, dim, shards)
    counting.records.clear()
    import datamask

    _enter("driver (start)")
    SECONDS.clear()  # the clock of the first phase starts with select
    settings = dict(select_ratio=0.1, seed=0, n_epochs=50, chunk_size=2000, progress=False)
    load_before = os.getloadavg()
    started = time.perf_counter()
    runner = phase_runner(workers)
    try:
        manifest = datamask.select(f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out", scheduler=runner,
                                   **settings)  # fmt: skip
    finally:
        runner.close()
    wall = time.perf_counter() - started
    _enter("(done)")
    load_after = os.getloadavg()
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    records = list(counting.records)
    done = [i.path for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out/_work/completions"))]
    markers = []
    for path in done:
        if path.rsplit("/", 1)[-1].isdigit():
            with fs.open_input_stream(path) as fh:
                markers.append(json.loads(fh.read()))
    server.shutdown()
    return {
        "shards": shards,
        "n_docs": n_docs,
        "dim": dim,
        "groups": manifest["totals"]["n_groups"],
        "datamask": datamask.__file__,
        "wall_s": round(wall, 1),
        "cpu_s": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1),
        "peak_rss_mb_this_process": round(me.ru_maxrss / 1024, 1),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in load_after],
        "requests": len(records),
        "bytes_in": sum(r[3] for r in records),
        "bytes_out": sum(r[4] for r in records),
        "phases": _summarise(records),
        "per_group_step": _group_steps(records, markers),
        "seconds": manifest["totals"]["seconds"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-docs", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, nargs="+", default=list(SHARDS))
    ap.add_argument("--one", type=int, help="run one point in this process, print its JSON")
    ap.add_argument("--out", type=Path, help="append each point's JSON row here")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_point(args.one, args.n_docs, args.dim, args.workers)))
        return
    for s in args.shards:  # each point in a fresh process: its own peak RSS and server
        cmd = [sys.executable, __file__, "--one", str(s), "--n-docs", str(args.n_docs)]
        cmd += ["--dim", str(args.dim), "--workers", str(args.workers)]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
        row = json.loads(line.splitlines()[-1])
        print(json.dumps({k: row[k] for k in ("shards", "groups", "wall_s", "requests")}))
        if args.out:
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
