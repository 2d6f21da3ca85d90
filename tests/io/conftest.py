"""Fixtures of the storage-fault tests: a moto S3 server on 127.0.0.1 and a clean run
(:mod:`tests.io._storage_common` holds what they share besides)."""

from __future__ import annotations

import pytest

from datamask import make_clustered
from datamask.cli import main
from tests._data import write_corpus_shards
from tests.io._storage_common import BUCKET, FAST, ONE, _selected
from tests.io.test_remote import moto_bucket


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 (its port too, for the proxy), env set for it."""
    with moto_bucket(tmp_path_factory, BUCKET) as started:
        yield started


@pytest.fixture(scope="module")
def clean(s3, tmp_path_factory):
    """2 shards x 200 rows (16-d) under ``data/``, and the selected ids of a clean run."""
    client, _, _ = s3
    corpus = make_clustered(400, 16, 6, seed=1)
    for f in write_corpus_shards(tmp_path_factory.mktemp("shards"), corpus, 2):
        client.upload_file(str(f), BUCKET, f"data/{f.name}")
    argv = ["select", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/clean"]
    assert main([*argv, *FAST, *ONE]) == 0
    ids = _selected(client, "clean")
    assert len(ids) == 80
    return ids
