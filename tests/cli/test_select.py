"""``datamask select`` end to end: outputs, config files, determinism and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask.cli import main
from tests._data import write, write_columns, write_not_parquet

FAST = ["--n-epochs", "30", "--no-progress", "--device", "cpu"]


def run_cli(*argv: str) -> int:
    return main([str(a) for a in argv])


def test_reference_layout_needs_no_flags(tmp_path, reference_parquet, capsys):
    out = tmp_path / "out" / "sel.parquet"
    assert run_cli("select", "--input", reference_parquet, "--output", out, *FAST) == 0
    table = pq.read_table(out)
    assert table.column_names == [
        "chunk_id",
        "selected",
        "logit",
        "probability",
        "rank",
        "covered_by",
        "covered_sim",
        "covered_exact",
    ]
    assert table.num_rows == 400
    assert sum(table.column("selected").to_pylist()) == round(0.3 * 400)
    assert sorted(table.column("rank").to_pylist()) == list(range(1, 401))
    summary = json.loads((tmp_path / "out" / "sel.summary.json").read_text())
    assert summary["k"] == 120 and summary["n_docs"] == 400
    assert set(summary["terms"]) == {"quality", "facility", "J"}
    assert summary["settings"]["algorithm"] == ["Facility"]
    assert "torch" in summary["versions"]
    assert "selected 120 of 400 documents" in capsys.readouterr().out


def test_same_seed_same_output(tmp_path, reference_parquet):
    paths = []
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        out = tmp_path / f"{name}.parquet"
        assert (
            run_cli(
                "select",
                "--input",
                reference_parquet,
                "--output",
                out,
                "--seed",
                seed,
                "--estimator",
                "reinforce",
                "--n_rollout",
                "8",
                *FAST,
            )
            == 0
        )
        paths.append(pq.read_table(out))
    assert paths[0].equals(paths[1])
    assert not paths[0].equals(paths[2])


@pytest.mark.parametrize("fmt", ["yaml", "toml"])
def test_config_file_and_flag_override(tmp_path, reference_parquet, fmt):
    cfg = tmp_path / f"run.{fmt}"
    if fmt == "yaml":
        cfg.write_text("select_ratio: 0.1\nalgorithm: Pair_simi\nn-epochs: 20\nlamb: 0.7\n")
    else:
        cfg.write_text('select_ratio = 0.1\nalgorithm = "Pair_simi"\nn_epochs = 20\n')
    out = tmp_path / "sel.parquet"
    assert (
        run_cli(
            "select",
            "--config",
            cfg,
            "--input",
            reference_parquet,
            "--output",
            out,
            "--select_ratio",
            "0.2",
            "--no-progress",
        )
        == 0
    )
    summary = json.loads((tmp_path / "sel.summary.json").read_text())
    assert summary["k"] == 80  # the flag wins over the file
    assert set(summary["terms"]) == {"quality", "pairwise", "J"}
    assert summary["settings"]["n_epochs"] == 20


@pytest.mark.parametrize("method", ["topk", "random", "greedy", "stochastic-greedy"])
def test_methods_select_exactly_k(tmp_path, reference_parquet, method):
    out = tmp_path / "sel.parquet"
    assert (
        run_cli(
            "select",
            "--input",
            reference_parquet,
            "--output",
            out,
            "--method",
            method,
            "--select-ratio",
            "0.1",
            "--selected-only",
            *FAST,
        )
        == 0
    )
    table = pq.read_table(out)
    assert table.column_names == ["chunk_id", "rank"]
    assert table.num_rows == 40


def test_weighted_quality_columns(tmp_path, small_corpus):
    x = small_corpus.features
    table = pa.table(
        {
            "doc": list(small_corpus.ids),
            "edu": small_corpus.quality[:, 0],
            "dclm": -small_corpus.quality[:, 0],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1]),
        }
    )
    src = write(table, tmp_path / "w.parquet")
    out = tmp_path / "sel.parquet"
    assert (
        run_cli(
            "select",
            "--input",
            src,
            "--output",
            out,
            "--id-col",
            "doc",
            "--feature-col",
            "vec",
            "--quality-col",
            "edu:3",
            "--quality-col",
            "dclm:1",
            "--method",
            "topk",
            "--select-ratio",
            "0.1",
            *FAST,
        )
        == 0
    )
    chosen = set(pq.read_table(out).filter(pa.compute.field("selected")).column("doc").to_pylist())
    best = set(np.asarray(small_corpus.ids)[np.argsort(-small_corpus.quality[:, 0])[:40]])
    assert chosen == best  # 3 * edu - 1 * edu still ranks by edu


def _bad_files(tmp_path, reference_parquet):
    def write(name, **cols):
        return write_columns(tmp_path / name, **cols)

    junk = write_not_parquet(tmp_path / "junk.parquet", b"\x00garbage")
    return {
        "missing column": (
            ["--input", reference_parquet, "--quality-col", "score"],
            "column 'score' not found",
        ),
        "ragged": (
            [
                "--input",
                write(
                    "r.parquet",
                    chunk_id=["a", "b"],
                    quality_score=[1.0, 2.0],
                    feature_arr=pa.array([[1.0, 0.0], [1.0, 0.0, 0.0]]),
                ),
            ],
            "embedding width 3 at row 1",
        ),
        "nan score": (
            [
                "--input",
                write(
                    "n.parquet",
                    chunk_id=["a", "b"],
                    quality_score=[float("nan"), 2.0],
                    feature_arr=pa.array([[1.0, 0.0], [0.0, 1.0]]),
                ),
            ],
            "quality_score has 1 null, NaN or inf values",
        ),
        "null score": (
            [
                "--input",
                write(
                    "nul.parquet",
                    chunk_id=["a", "b"],
                    quality_score=[1.0, None],
                    feature_arr=pa.array([[1.0, 0.0], [0.0, 1.0]]),
                ),
            ],
            r"quality_score has 1 null, NaN or inf values \(first at row 1 ",
        ),
        "inf feature": (
            [
                "--input",
                write(
                    "i.parquet",
                    chunk_id=["a", "b"],
                    quality_score=[1.0, 2.0],
                    feature_arr=pa.array([[1.0, float("inf")], [0.0, 1.0]]),
                ),
            ],
            "NaN/inf values",
        ),
        "empty": (
            [
                "--input",
                write(
                    "e.parquet",
                    chunk_id=pa.array([], pa.string()),
                    quality_score=pa.array([], pa.float64()),
                    feature_arr=pa.array([], pa.list_(pa.float32())),
                ),
            ],
            "has no rows",
        ),
        "ratio high": (
            ["--input", reference_parquet, "--select-ratio", "1.5"],
            r"select_ratio must be in \(0, 1\); got 1.5",
        ),
        "ratio zero": (
            ["--input", reference_parquet, "--select_ratio", "0"],
            r"select_ratio must be in \(0, 1\); got 0.0",
        ),
        "unreadable": (["--input", junk], "cannot read"),
        "absent": (["--input", tmp_path / "nope.parquet"], "does not exist"),
        "bad config": (
            [
                "--input",
                reference_parquet,
                "--config",
                write_text(tmp_path / "c.yaml", "select_ratio: 0.1\nwarmup: 3\n"),
            ],
            r"unknown setting\(s\) \['warmup'\]",
        ),
    }


def write_text(path, text):
    path.write_text(text)
    return path


def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, reference_parquet, capsys):
    for name, (argv, message) in _bad_files(tmp_path, reference_parquet).items():
        out = tmp_path / f"out-{name.replace(' ', '-')}.parquet"
        code = run_cli("select", *argv, "--output", out, *FAST)
        err = capsys.readouterr().err.strip()
        assert code == 2, name
        assert err.startswith("datamask: error: "), (name, err)
        assert len(err.splitlines()) == 1, (name, err)
        assert __import__("re").search(message, err), (name, err)
        assert not out.exists() and not out.with_name(out.name + ".tmp").exists(), name
        assert not (tmp_path / f"out-{name.replace(' ', '-')}.summary.json").exists(), name


def test_unknown_algorithm_is_an_argparse_error(tmp_path, reference_parquet, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(
            "select",
            "--input",
            reference_parquet,
            "--output",
            tmp_path / "o.parquet",
            "--algorithm",
            "Facilty",
        )
    assert exc.value.code == 2
    assert "invalid choice: 'Facilty'" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamask.cli",
            "select",
            "--input",
            str(tmp_path / "nope.parquet"),
            "--output",
            str(tmp_path / "o.parquet"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("datamask: error: input") and "nope.parquet" in err, err


def test_the_config_file_is_read_once(tmp_path, reference_parquet, monkeypatch):
    """Before the parser is built (its term modules add flags), and never again: not by the
    staging of paths, not by select's settings."""
    import importlib

    config = importlib.import_module("datamask.cli.config_file")
    cli_main = importlib.import_module("datamask.cli.main")  # datamask.cli.main is the function

    calls = []
    real = config.load_config

    def counted(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(config, "load_config", counted)
    monkeypatch.setattr(cli_main, "load_config", counted)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"select_ratio: 0.2\nmethod: topk\ninput: {reference_parquet}\n")
    out = tmp_path / "sel.parquet"
    assert main(["select", "--config", str(cfg), "--output", str(out), "--no-progress"]) == 0
    assert calls == [str(cfg)]
    assert pq.read_table(out).column("selected").to_numpy().sum() == 80
