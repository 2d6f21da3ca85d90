"""``bench``'s one frozen spec: declared once, checked once at the door, the same from the
flags as from the library's keywords."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from datamask import make_clustered
from datamask.cli.bench import add_bench_parser, run_bench
from datamask.config import SelectorSpec
from datamask.evaluation import BenchSpec, bench
from datamask.evaluation.bench_spec import SyntheticSpec, parse_method_param


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_spec_is_frozen_and_normalised():
    spec = BenchSpec(methods=["topk", "random"], dup_thresholds=[0.99, 0.9], out_dir=Path("o"))
    assert spec.methods == ("topk", "random")
    assert spec.dup_thresholds == (0.9, 0.99)  # sorted distinct, as check_thresholds holds
    assert spec.out_dir == "o"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 3  # type: ignore[misc]


def test_shared_settings_are_selects_declarations():
    spec = BenchSpec()
    assert (spec.select_ratio, spec.seed, spec.device) == (
        SelectorSpec.select_ratio,
        SelectorSpec.seed,
        SelectorSpec.device,
    )
    with pytest.raises(ValueError, match=r"^select_ratio must be in \(0, 1\); got 1.5\.$"):
        BenchSpec(select_ratio=1.5)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"map_points": 0}, ValueError, r"^map_points must be >= 1; got 0\.$"),
        ({"map_method": "umap"}, ValueError, r"^map_method must be one of \['pca', 'tsne'\]"),
        ({"isolate": "no"}, TypeError, r"^isolate must be true or false; got 'no'\.$"),
        ({"dup_thresholds": [0.9, 1.5]}, ValueError, r"^dup_thresholds must be in \(-1, 1\)"),
        ({"dup_search": "fast"}, ValueError, r"^dup_search must be one of"),
        ({"methods": ["lazy"]}, ValueError, r"^methods must be one of \['mask', "),
        ({"methods": ["topk", "topk"]}, ValueError, r"lists a method twice"),
        ({"device": "gpu"}, ValueError, r"^device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ({"seed": -1}, ValueError, r"^seed must be in \[0, "),
        ({"threads": 0}, ValueError, r"^threads must be >= 1; got 0\.$"),
        ({"lamb": 2.0}, ValueError, r"^lamb in bench's arguments must be in \[0, 1\]; got 2\.0\.$"),
        ({"n_epochs": 0, "methods": ["mask"]}, ValueError, r"n_epochs must be > 0; got 0\."),
        (
            {"method_params": {"topk": {"n_epochs": 5}}, "methods": ["topk"]},
            ValueError,
            r"n_epochs is not a parameter of method 'topk'",
        ),
        ({"param": ["mask.n_epochs=x"]}, ValueError, r"--param value 'x' is not int"),
        ({"colour": "red"}, ValueError, r"unknown setting\(s\) \['colour'\]"),
        ({"methods": 3}, TypeError, r"^methods must be a name or a list of names; got 3\.$"),
        ({"term_modules": 3}, TypeError, r"^term_modules in bench's arguments must be a name"),
    ],
)
def test_a_bad_value_is_refused_naming_the_parameter(settings, error, message, tmp_path):
    out = tmp_path / "bench"
    with pytest.raises(error, match=message):
        bench(make_clustered(40, 4, 2, seed=0), **{"out_dir": out, "isolate": False, **settings})
    assert not out.exists()  # refused at the door: nothing written, nothing run


def test_each_methods_spec_is_built_and_checked_once_when_the_spec_is_made():
    spec = BenchSpec.from_mapping({"methods": ["mask", "topk"], "n_epochs": 7, "seed": 4})
    mask = spec.select_spec("mask")
    assert mask is spec.select_spec("mask")  # the one made at the door, not a new one
    assert mask.__dict__.get("_checked") and dict(mask.selector.params)["n_epochs"] == 7
    assert mask.selector.seed == 4 and spec.params_of("topk") == {}


def test_the_flags_and_the_library_make_the_same_spec(tmp_path):
    argv = ["--synthetic", "60", "--out-dir", str(tmp_path), "--methods", "greedy", "mask"]
    argv += ["--select-ratio", "0.2", "--seed", "5", "--lamb", "0.3", "--n-epochs", "9"]
    argv += ["--param", "greedy.batch_size=4", "--no-isolate", "--no-plots", "--map", "tsne"]
    argv += ["--dup-thresholds", "0.8", "0.95", "--no-progress", "--eps", "0.5"]
    args = vars(_parse(argv))
    from_flags = BenchSpec.from_mapping({k: args.get(k) for k in BenchSpec.flat_keys()})
    from_library = BenchSpec.from_mapping(
        {
            "methods": ["greedy", "mask"],
            "select_ratio": 0.2,
            "seed": 5,
            "lamb": 0.3,
            "method_params": {"mask": {"n_epochs": 9}, "greedy": {"batch_size": 4}},
            "isolate": False,
            "plots": False,
            "map_method": "tsne",
            "dup_thresholds": (0.8, 0.95),
            "progress": False,
            "out_dir": tmp_path,
        }
    )
    assert from_flags.params_of("mask") == from_library.params_of("mask") == {"n_epochs": 9}
    assert from_flags.params_of("greedy") == {"batch_size": 4}  # --eps: no method run takes it
    flags = dataclasses.asdict(from_flags) | {"method_params": None}
    library = dataclasses.asdict(from_library) | {"method_params": None}
    assert flags == library


def test_parse_method_param_types_by_the_keys_option():
    assert parse_method_param("mask.partial=0.2") == ("mask", "partial", 0.2)
    assert parse_method_param("greedy.max_similarity=none") == ("greedy", "max_similarity", None)
    with pytest.raises(ValueError, match=r"eps is not a parameter of method 'greedy'"):
        parse_method_param("greedy.eps=1")


def test_synthetic_data_is_checked_by_its_declarations(tmp_path):
    with pytest.raises(ValueError, match=r"^synthetic must be >= 2; got 1\.$"):
        SyntheticSpec(synthetic=1)
    args = _parse(["--synthetic", "50", "--clusters", "0", "--out-dir", str(tmp_path / "b")])
    with pytest.raises(ValueError, match=r"^clusters must be >= 1; got 0\.$"):
        run_bench(args)
    corpus = SyntheticSpec(synthetic=30, dim=3, clusters=2, data_seed=1).make()
    assert corpus.n_docs == 30 and corpus.source == "make_clustered(30, 3, 2, seed=1)"
