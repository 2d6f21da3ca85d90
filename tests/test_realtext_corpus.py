"""The chunking and extraction rules of ``benchmarks/realtext/build_corpus.py`` on tiny inputs."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "realtext"
SCRIPT = FOLDER / "build_corpus.py"


@pytest.fixture(scope="module")
def bc():
    """The builder's chunking and extraction modules, imported as the script imports them
    (``python benchmarks/realtext/build_corpus.py`` puts its folder first on sys.path)."""
    sys.path.insert(0, str(FOLDER))
    try:
        chunking = importlib.import_module("chunking")
        sources = importlib.import_module("sources")
    finally:
        sys.path.remove(str(FOLDER))
    return SimpleNamespace(
        split_long=chunking.split_long,
        squeeze_tables=chunking.squeeze_tables,
        HeadingSections=sources.HeadingSections,
        _comment_blocks=sources._comment_blocks,
        _docstrings=sources._docstrings,
    )


@pytest.mark.slow
def test_script_imports_its_modules_from_its_folder():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("usage: build_corpus.py") and "--texts-only" in out


def test_split_long_keeps_short_texts_and_groups_paragraphs(bc):
    assert bc.split_long("one\n\ntwo", split_chars=100, group_chars=50) == ["one\n\ntwo"]
    paras = [f"paragraph {i} " + "x" * 30 for i in range(10)]  # 43 chars each
    parts = bc.split_long("\n\n".join(paras), split_chars=100, group_chars=100)
    assert all(len(p) <= 100 for p in parts)
    assert parts[0] == paras[0] + "\n\n" + paras[1]
    assert "\n\n".join(parts) == "\n\n".join(paras)  # nothing lost, order kept
    long_para = "\n".join(["line " + "y" * 20] * 10)  # one 259-char paragraph
    cut = bc.split_long(long_para, split_chars=100, group_chars=60)
    assert all(len(p) <= 60 for p in cut) and "\n".join(cut) == long_para


def test_heading_sections_split_at_headings_and_skip_navigation(bc):
    html = """<html><body><nav><h2>Menu</h2><a>Home</a></nav>
    <p>before any heading</p>
    <section id="intro"><h1>Intro<a class="headerlink">\u00b6</a></h1><p>First   para.</p>
    <div class="sphinxsidebar"><h3>Sidebar</h3><p>search</p></div>
    <pre>code  line 1
    line 2</pre>
    <h2 id="usage">Usage</h2><p>Call <code>f()</code>.</p><h2>Usage</h2><p>Again.</p>
    </section><footer>(c) nobody</footer></body></html>"""
    parser = bc.HeadingSections()
    parser.feed(html)
    assert parser.result() == [
        ("intro", "Intro\nFirst para.\ncode  line 1\n    line 2"),
        ("usage", "Usage\nCall f()."),
        ("usage~2", "Usage\nAgain."),
    ]


def test_comment_blocks_and_docstrings(bc):
    source = (
        "#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n"
        "# Licence line one\n#   indented two\n\nx = 1  # trailing, not a block\n"
        "class A:\n    '''Class doc.'''\n    def f(self):\n        '''Method\n\n        doc.'''\n"
    )
    assert bc._comment_blocks(source) == [(3, "Licence line one\n  indented two")]
    assert bc._docstrings(ast.parse(source)) == [("A", "Class doc."), ("A.f", "Method\n\ndoc.")]


def test_squeeze_tables_narrows_only_box_drawn_lines(bc):
    wide = "\u250c" + "\u2500" * 50 + "\u2510\n\u2502name" + " " * 40 + "\u2502 value \u2502"
    prose = "Aligned    columns    in prose stay."
    assert bc.squeeze_tables(f"{wide}\n{prose}") == (
        "\u250c\u2500\u2500\u2500\u2510\n\u2502name   \u2502 value \u2502\n" + prose
    )
