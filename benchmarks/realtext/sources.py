"""Extraction of the real-text corpus' sources into sections (``demo.Doc``), before chunking.

HTML documentation (one section per h1-h3 heading), the perl manual, Vim's help files and the
docstrings and comment blocks of Python's standard library are extracted here; the Python
documentation, the Linux man pages and the fortunes by ``examples/demo/build_demo.py``.
``extract`` runs every source and caches each one's sections.
"""

from __future__ import annotations

import ast
import gzip
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

from corpus_spec import PACKAGES, SOURCES, demo
from tqdm import tqdm

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
