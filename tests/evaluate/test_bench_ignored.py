"""``bench`` says which flags a combination ignores (issue 34, class 6): ``--map`` and
``--map-points`` with ``--no-plots``, and ``--dim``/``--clusters``/``--data-seed`` with
``--input`` warn once, like select's ignored settings, and are not recorded in bench.json as
used."""

from __future__ import annotations

import json
import warnings

import pytest

from datamask import make_clustered
from datamask.cli import main
from datamask.evaluation import BenchSpec, bench
from datamask.evaluation.bench_spec import SyntheticSpec
from tests._data import write_reference_layout

QUICK = ["--methods", "topk", "random", "--no-isolate", "--no-progress", "--device", "cpu"]


def _bench_cli(tmp_path, capsys, *flags) -> tuple[dict, list[str]]:
    data = write_reference_layout(tmp_path / "docs.parquet", make_clustered(60, 4, 3, seed=0))
    out = tmp_path / "b"
    assert main(["bench", "--input", str(data), "--out-dir", str(out), *QUICK, *flags]) == 0
    err = capsys.readouterr().err.splitlines()
    return json.loads((out / "bench.json").read_text()), [e for e in err if "ignored" in e]


def test_map_flags_with_no_plots_and_synthetic_flags_with_input_warn(tmp_path, capsys):
    result, said = _bench_cli(
        tmp_path, capsys, "--no-plots", "--map", "tsne", "--map-points", "7", "--dim", "9",
        "--clusters", "4",
    )  # fmt: skip
    assert said == [
        "datamask: warning: dim=9 is ignored: it shapes --synthetic data, not --input; it is "
        "not recorded as used.",
        "datamask: warning: clusters=4 is ignored: it shapes --synthetic data, not --input; "
        "it is not recorded as used.",
        "datamask: warning: map_method='tsne' is ignored: --no-plots draws no map; it is not "
        "recorded as used.",
        "datamask: warning: map_points=7 is ignored: --no-plots draws no map; it is not "
        "recorded as used.",
    ]
    assert result["ignored_settings"] == {
        "map_method": {"value": "tsne", "why": "--no-plots draws no map"},
        "map_points": {"value": 7, "why": "--no-plots draws no map"},
    }
    assert result["settings"]["dim"] == 4  # the data's width, not --dim
    assert not {"map_method", "map_points", "clusters"} & set(result["settings"])


def test_a_bench_that_reads_every_flag_warns_of_none(tmp_path, capsys):
    result, said = _bench_cli(tmp_path, capsys, "--no-plots", "--map", "pca")  # the default
    assert said == [] and "ignored_settings" not in result


def test_the_library_warns_alike_and_the_specs_say_why():
    spec = BenchSpec(
        methods=("topk",), plots=False, map_method="tsne", map_points=10, isolate=False
    )
    assert spec.ignored() == {
        "map_method": "--no-plots draws no map",
        "map_points": "--no-plots draws no map",
    }
    assert BenchSpec(map_method="tsne").ignored() == {"map_method": "no out_dir: nothing is drawn"}
    assert SyntheticSpec(dim=3).ignored() == {"dim": "it shapes --synthetic data, not --input"}
    assert SyntheticSpec(synthetic=10, dim=3).ignored() == {}
    with pytest.raises(ValueError, match="synthetic must be a number of documents"):
        SyntheticSpec(dim=3).make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = bench(make_clustered(40, 4, 2, seed=0), spec=spec)
    assert [str(w.message).split(" is ignored")[0] for w in caught] == [
        "map_method='tsne'",
        "map_points=10",
    ]
    assert set(result["ignored_settings"]) == {"map_method", "map_points"}
