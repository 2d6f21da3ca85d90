"""What the storage-fault tests share: a moto server, a clean run, snapshots."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "faults"
FAST = ["--n-epochs", "10", "--select-ratio", "0.2", "--n-neighbors", "8", "--no-progress"]
ONE = ["--runner", "local", "--workers", "1"]  # steps in this process: no pool to start
#: Chance of a fault per request (error200, every CopyObject / CompleteMultipartUpload up
#: to MAX_FAULTS: a select makes none, its objects are one PutObject each).
#: A run makes ~150 requests: at 0.05 each seed meets a fault (e^-7.5 that it does not),
#: and MAX_FAULTS bounds what they cost.
RATE = {"throttle": 0.05, "drop": 0.05, "outage": 0.05}
#: Faults one run meets at most: each costs the SDK's backoff (about a second), and the
#: suite runs 20 of these runs.
MAX_FAULTS = 2


def _keys(client, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _bucket(client) -> dict[str, bytes]:
    """Every object of the bucket, by key (its bytes)."""
    return {k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in _keys(client)}


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _selected(client, prefix: str) -> list[str]:
    ids: list[str] = []
    for key in _keys(client, f"{prefix}/selected/"):
        if key.endswith(".parquet") and "/." not in key:
            body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            ids += pq.read_table(io.BytesIO(body)).column("chunk_id").to_pylist()
    return sorted(ids)
