"""Fixtures of the storage-fault tests: a moto S3 server on 127.0.0.1 and a clean run
(:mod:`tests.io._storage_common` holds what they share besides)."""

from __future__ import annotations

import pytest

from datamask import make_clustered
from datamask.cli import main
from tests._data import write_corpus_shards
from tests.io._storage_common import BUCKET, FAST, ONE, _selected

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 (its port too, for the proxy), env set for it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "DATAMASK_CACHE": str(tmp_path_factory.mktemp("cache")),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket=BUCKET)
        yield client, env, port
    server.stop()


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
