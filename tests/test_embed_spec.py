"""``embed``'s one frozen spec: declared once, checked once at the door, the same from the
flags as from the library's keywords."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from datamask.cli.embed import add_embed_parser
from datamask.cli.main import EXIT_BAD_INPUT, main
from datamask.embedding import EmbedSpec, embed_file, embed_texts
from datamask.settings import section_settings


def test_spec_is_frozen_and_holds_a_path_as_text():
    spec = EmbedSpec(model=Path("models/mini"), batch_size=8)
    assert spec.model == "models/mini" and spec.batch_size == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, r"^batch_size must be >= 1; got 0\.$"),
        ({"max_seq_length": 1.5}, TypeError, r"^max_seq_length must be >= 1; got 1\.5\.$"),
        ({"chunk_rows": -3}, ValueError, r"^chunk_rows must be >= 1; got -3\.$"),
        ({"quality": "fasttext"}, ValueError, r"^quality must be one of \['heuristic'\]"),
        ({"device": "tpu"}, ValueError, r"^device must be 'auto', 'cpu', 'cuda', 'cuda:N' or"),
        ({"text_col": 3}, TypeError, r"^text_col must be a string; got 3\.$"),
        ({"progress": "no"}, TypeError, r"^progress must be true or false"),
        ({"colour": "red"}, ValueError, r"^unknown setting\(s\) \['colour'\]"),
    ],
)
def test_a_bad_value_is_refused_naming_the_parameter(settings, error, message, tmp_path):
    out = tmp_path / "out.parquet"
    with pytest.raises(error, match=message):  # before the input is even listed
        embed_file(tmp_path / "missing.jsonl", out, **settings)
    assert not out.exists()


def test_keywords_over_a_spec():
    spec = EmbedSpec.of(EmbedSpec(batch_size=8, device="cpu"), {"batch_size": 2})
    assert (spec.batch_size, spec.device) == (2, "cpu")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['batch'\]"):
        EmbedSpec.of(EmbedSpec(), {"batch": 2})


def test_a_preset_names_the_columns_written():
    spec = EmbedSpec(preset="fineweb-edu")
    assert (spec.id_col, spec.feature_col, spec.quality_col) == ("id", "embedding", "score")
    assert EmbedSpec(preset="fineweb-edu", feature_col="emb").feature_col == "emb"


def test_embed_texts_checks_with_the_specs_declarations():
    with pytest.raises(ValueError, match=r"^max_seq_length must be >= 1; got 0\.$"):
        embed_texts(["a"], max_seq_length=0, progress=False)


def test_the_flags_and_the_library_make_the_same_spec():
    parser = argparse.ArgumentParser()
    add_embed_parser(parser.add_subparsers(dest="command"))
    argv = ["embed", "--input", "a.jsonl", "--output", "o.parquet", "--text_col", "body"]
    argv += ["--quality", "heuristic", "--batch-size", "8", "--max-seq-length", "64"]
    argv += ["--device", "cpu", "--no-progress", "--chunk-rows", "100", "--id-col", "doc"]
    args = vars(parser.parse_args(argv))
    from_flags = EmbedSpec.from_mapping({s.name: args[s.name] for s in section_settings(EmbedSpec)})
    from_library = EmbedSpec.from_mapping(
        {
            "text_col": "body",
            "quality": "heuristic",
            "batch_size": 8,
            "max_seq_length": 64,
            "device": "cpu",
            "progress": False,
            "chunk_rows": 100,
            "id_col": "doc",
        }
    )
    assert from_flags == from_library
    assert from_flags.feature_col == EmbedSpec().feature_col == "feature_arr"  # one default


def test_the_command_refuses_a_bad_flag_before_any_output(tmp_path, capsys):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "x"}\n')
    out = tmp_path / "o.parquet"
    argv = ["embed", "--input", str(src), "--output", str(out), "--chunk-rows", "0"]
    assert main(argv) == EXIT_BAD_INPUT
    assert "chunk_rows must be >= 1; got 0." in capsys.readouterr().err
    assert not out.exists()
