"""One door shape (issue 45): one function per command at the package root, each
``door(input, [selection,] output, spec=None, **settings)``, on one spec base; the
selectors' one contract (``fit``, ``transform``, ``fit_transform``); every command's flags
(``--config``, ``--output``, ``--preset``, the columns) and their reference in docs/cli.md."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import datamask
from datamask.cli import build_parser
from datamask.settings import Spec

ROOT = Path(__file__).resolve().parents[1]
DOORS = {
    "select": "datamask.api",
    "evaluate": "datamask.evaluation",
    "apply": "datamask.applying",
    "report": "datamask.evaluation",
    "bench": "datamask.evaluation",
    "embed": "datamask.embedding",
}
SPECS = [
    datamask.EvaluateSpec,
    datamask.ApplySpec,
    datamask.ReportSpec,
    datamask.BenchSpec,
    datamask.EmbedSpec,
]


@pytest.mark.parametrize(("door", "module"), DOORS.items())
def test_importing_a_subpackage_does_not_change_a_door(door, module):
    before = getattr(datamask, door)
    importlib.import_module(module)
    for sub in ("datamask.evaluation", "datamask.applying", "datamask.embedding"):
        importlib.import_module(sub)
    assert getattr(datamask, door) is before and inspect.isfunction(before)
    assert before.__module__ == ("datamask.api" if door == "select" else "datamask.doors")


@pytest.mark.parametrize("door", DOORS)
def test_every_door_has_one_shape(door):
    params = list(inspect.signature(getattr(datamask, door)).parameters.values())
    names = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    middle = ["selection"] if door in ("evaluate", "apply", "report") else []
    assert names == ["input", *middle, "output", "spec"]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD and params[-1].name == "settings"
    spec = next(p for p in params if p.name == "spec")
    assert spec.default is None


@pytest.mark.parametrize(
    ("door", "args"),
    [
        ("select", ("in.parquet", "out.parquet")),
        ("evaluate", ("in.parquet", "sel.parquet", None)),
        ("apply", ("in.parquet", "sel.parquet", "out")),
        ("report", ("in.parquet", "sel.parquet", "out")),
        ("bench", ("in.parquet", "out")),
        ("embed", ("in.jsonl", "out.parquet")),
    ],
)
def test_an_unknown_setting_is_refused_before_any_work(door, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['no_such_key'\] in " + door):
        getattr(datamask, door)(*args, no_such_key=1)
    assert list(tmp_path.iterdir()) == []


def test_every_spec_sits_on_one_base_with_progress_and_threads_declared_once():
    progress, threads = (
        next(f for f in fields(Spec) if f.name == n) for n in ("progress", "threads")
    )
    for cls in [*SPECS, datamask.config.RunSpec]:
        assert issubclass(cls, Spec)
        own = {f.name: f for f in fields(cls)}
        assert own["progress"] is progress and own["threads"] is threads  # inherited, once
        assert cls().progress is True and cls().threads is None
    for path in (ROOT / "src" / "datamask").rglob("*.py"):
        text = path.read_text()
        declared = re.findall(r"^\s+(progress|threads): [^=]+= setting_field", text, re.M)
        assert not declared or path.name == "settings.py", f"{path} declares {declared}"


@pytest.mark.parametrize("cls", SPECS)
def test_keywords_override_a_spec(cls):
    spec = cls(progress=False)
    over = cls.of(spec, {"threads": 2}, where="x")
    assert (over.progress, over.threads) == (False, 2)
    assert cls.of(spec, {}, where="x") is spec
    with pytest.raises(TypeError, match="spec must be a"):
        cls.of(object(), {}, where="x")


def test_the_root_exports_the_selector_contract_and_every_baseline():
    assert datamask.Selector is datamask.base.Selector
    for name, cls in datamask.SELECTORS.items():
        assert issubclass(cls, datamask.Selector), name
        assert getattr(datamask, cls.__name__) is cls, f"{cls.__name__} not at the root"
        for method in ("fit", "transform", "fit_transform"):
            assert callable(getattr(cls, method))
    assert datamask.read_corpus is importlib.import_module("datamask.io.parquet").read_corpus
    assert set(datamask.__all__) <= set(dir(datamask))


@pytest.mark.parametrize("method", ["greedy", "topk", "random", "stochastic-greedy"])
def test_transform_returns_the_selected_rows_as_a_corpus(method):
    corpus = datamask.make_clustered(120, 6, 4, seed=1)
    selector = datamask.SELECTORS[method](select_ratio=0.25, device="cpu", seed=3)
    with pytest.raises(RuntimeError, match="not fitted yet"):
        selector.transform(corpus)
    subset = selector.fit_transform(corpus)
    assert isinstance(subset, datamask.Corpus) and subset.n_docs == 30
    np.testing.assert_array_equal(subset.ids, corpus.ids[selector.selected_])
    np.testing.assert_array_equal(subset.features, corpus.features[selector.selected_])
    np.testing.assert_allclose(  # the rows keep the quality they were selected with
        subset.normalized_quality(), corpus.normalized_quality()[selector.selected_]
    )
    again = datamask.SELECTORS[method](select_ratio=0.25, device="cpu", seed=3).fit(corpus)
    np.testing.assert_array_equal(again.transform(corpus).ids, subset.ids)
    with pytest.raises(ValueError, match="fitted on 120"):
        selector.transform(datamask.make_clustered(50, 6, 4))


# --- the command line -----------------------------------------------------------------------
def _commands() -> dict:
    return build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]


@pytest.mark.parametrize("command", ["select", "evaluate", "apply", "report", "bench", "embed"])
def test_every_command_takes_config_output_preset_and_the_columns(command):
    flags = {f for a in _commands()[command]._actions for f in a.option_strings}
    needed = {"--config", "--output", "--preset", "--id-col", "--feature-col", "--quality-col"}
    assert needed <= flags, needed - flags
    assert {"--threads", "--no-progress"} <= flags


#: Every command's long flags as a fresh process builds the parser: only the shipped terms'
#: flags (a test in this process may have registered a term of its own, with its flags).
SHIPPED_FLAGS = """
import json
from datamask.cli import build_parser
commands = build_parser()._subparsers._group_actions[0].choices
print(json.dumps({name: sorted(f for a in p._actions for f in a.option_strings
                               if f[:2] == "--" and "_" not in f)
                  for name, p in commands.items()}))
"""


def test_every_flag_of_every_command_is_in_the_reference():
    text = (ROOT / "docs" / "cli.md").read_text()
    out = subprocess.run(
        [sys.executable, "-c", SHIPPED_FLAGS], capture_output=True, text=True, check=True
    )
    missing = {}
    for name, shipped in json.loads(out.stdout).items():
        start = text.find(f"## `datamask {name}` flags")
        assert start >= 0, f"docs/cli.md has no section `datamask {name}` flags"
        end = text.find("\n## `datamask ", start + 1)  # select's sharded table follows its own
        section = text[start : end if end > 0 else None]
        flags = set(shipped)
        named = set(re.findall(r"`(--[a-z][a-z0-9-]*)", section))  # `--flag` or `--flag X`
        gone = sorted(flags - {"--help"} - named)
        if gone:
            missing[name] = gone
    assert not missing, f"flags missing from docs/cli.md: {missing}"


def test_the_generated_flag_tables_are_up_to_date():
    """docs/cli.md's tables after its marker are what ``python -m datamask.cli.docs`` makes
    from the parsers (in a fresh process: only the shipped terms' flags)."""
    done = subprocess.run(
        [sys.executable, "-m", "datamask.cli.docs", str(ROOT / "docs" / "cli.md"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_table_generator_refuses_a_page_without_its_marker():
    from datamask.cli.docs import MARKER, update

    with pytest.raises(ValueError, match="has no line"):
        update("# a page\n")
    page = f"# a page\n\nhand-written\n\n{MARKER}\nstale table\n"
    made = update(page)
    assert made.startswith("# a page\n\nhand-written\n") and "stale table" not in made
    assert "## `datamask bench` flags" in made and "| `--methods` METHODS |" in made
