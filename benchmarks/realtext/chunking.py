"""Chunking and selection of the real-text corpus: long sections cut into paragraph groups,
box-drawn tables narrowed, then short texts and exact duplicates dropped and each source capped.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from corpus_spec import CAP, GROUP_CHARS, MIN_CHARS, SOURCES, SPLIT_CHARS, demo


def split_long(
    text: str, split_chars: int = SPLIT_CHARS, group_chars: int = GROUP_CHARS
) -> list[str]:
    """Cut a text longer than ``split_chars`` into groups of paragraphs of <= ``group_chars``.

    Paragraphs are separated by blank lines and kept whole; a paragraph longer than
    ``group_chars`` is cut at line ends (a single line longer than that stays whole). Texts of
    at most ``split_chars`` characters are returned unchanged, as the only element.
    """
    if len(text) <= split_chars:
        return [text]
    pieces: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        if len(para) <= group_chars:
            pieces.append(para)
            continue
        cur: list[str] = []
        for line in para.split("\n"):
            if cur and sum(len(x) + 1 for x in cur) + len(line) > group_chars:
                pieces.append("\n".join(cur))
                cur = []
            cur.append(line)
        if cur:
            pieces.append("\n".join(cur))
    groups: list[str] = []
    cur_len = -1
    for piece in pieces:
        if not piece.strip():
            continue
        if groups and cur_len + 2 + len(piece) <= group_chars:
            groups[-1] += "\n\n" + piece
            cur_len += 2 + len(piece)
        else:
            groups.append(piece)
            cur_len = len(piece)
    return [g.strip() for g in groups if g.strip()]


TABLE_LINE = re.compile(r"[\u2502\u250c\u2510\u2514\u2518\u251c\u2524\u252c\u2534\u253c]")


def squeeze_tables(text: str) -> str:
    """Narrow box-drawn tables: in lines holding a box-drawing corner or bar, runs of 4 or
    more spaces (after the indentation) or of one horizontal rule character become 3.

    groff renders the man pages at a 5,000-column line length (one line per paragraph), and
    tbl stretches tables to that width, so a three-column table is ~5,000 characters of
    padding per line.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if TABLE_LINE.search(line):
            line = re.sub(r"([\u2500\u2501\u2550])\1{3,}", r"\1\1\1", line)
            lines[i] = re.sub(r"(?<=\S) {4,}", "   ", line)
    return "\n".join(lines)


def chunk(docs: list[demo.Doc]) -> list[demo.Doc]:
    """``squeeze_tables``, then ``split_long`` every document; parts get ids ``<id>~p<k>``."""
    out = []
    for d in docs:
        text = squeeze_tables(d.text)
        if text != d.text:
            d = demo.Doc(d.chunk_id, d.source, text, d.license, d.attribution, d.origin)
        parts = split_long(d.text)
        if len(parts) == 1:
            out.append(d)
            continue
        for k, part in enumerate(parts):
            out.append(
                demo.Doc(f"{d.chunk_id}~p{k}", d.source, part, d.license, d.attribution, d.origin)
            )
    return out


def select(docs: list[demo.Doc]) -> tuple[list[demo.Doc], dict[str, Counter]]:
    """Chunk, drop short texts and exact duplicates, cap each source; sorted by chunk_id."""
    counts: dict[str, Counter] = {s: Counter() for s in SOURCES}
    seen: set[str] = set()
    ids: set[str] = set()
    pool: dict[str, list[demo.Doc]] = {s: [] for s in SOURCES}
    for d in sorted(chunk(docs), key=lambda d: d.chunk_id):
        c = counts[d.source]
        c["chunks"] += 1
        if d.chunk_id in ids:  # e.g. a function defined twice in one module
            k = 2
            while f"{d.chunk_id}~{k}" in ids:
                k += 1
            d = demo.Doc(f"{d.chunk_id}~{k}", d.source, d.text, d.license, d.attribution, d.origin)
        ids.add(d.chunk_id)
        if len(d.text) < MIN_CHARS[d.source]:
            c["too_short"] += 1
            continue
        key = demo._norm(d.text)
        if key in seen:
            c["exact_duplicate"] += 1
            continue
        seen.add(key)
        pool[d.source].append(d)
    chosen: list[demo.Doc] = []
    for source, cand in pool.items():
        cand = sorted(cand, key=lambda d: hashlib.sha1(d.chunk_id.encode()).hexdigest())
        cap = CAP[source]
        counts[source]["candidates"] = len(cand)
        kept = cand if cap is None else cand[:cap]
        counts[source]["kept"] = len(kept)
        chosen.extend(kept)
    return sorted(chosen, key=lambda d: d.chunk_id), counts
