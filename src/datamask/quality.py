"""A text-only quality heuristic: the score of the demo data, for corpora that have none.

:func:`heuristic_quality` is the mean of six signals, each in [0, 1]. The words are
``text.split()`` and n is their number; a text with no words scores 0.

1. Alphabetic words: the fraction of words holding at least one letter.
2. Word length: 1 if 3 <= mean word length <= 10, else ``max(0, 1 - distance / 3)`` with
   the distance to the nearer end of [3, 10].
3. Stop words: ``min(1, stop-word fraction / 0.25)``, over the 82 English function words of
   :data:`STOP_WORDS`; each word is lower-cased and ``.,;:()"'`` stripped from its ends.
4. Sentence ends: the fraction of non-empty (stripped) lines matching ``[.!?]["'”’)\\]]*$``.
5. Unique lines: ``1 - (non-empty lines - distinct non-empty lines) / non-empty lines``.
6. Length: ``min(1, n_chars / 1000)``.

It is a rough proxy for "clean, prose-like, substantial text", not a judgement of content:
code, tables, lists and short texts score lower. It is exactly ``quality_score()`` of
``examples/demo/build_demo.py`` (the demo file's ``quality_score`` column), rounded to 6
decimals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

__all__ = ["STOP_WORDS", "heuristic_quality", "heuristic_quality_batch"]

_STOP_TEXT = """a about after all also an and any are as at be because been but by can could do does
    for from had has have he her his how i if in into is it its may more most must no not of
    on one only or other our out she should so some such than that the their them then there
    these they this those to up was we were what when where which while who will with would
    you your"""
#: The stop-word list of signal 3 (82 English function words).
STOP_WORDS = frozenset(_STOP_TEXT.split())
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")


def heuristic_quality(text: str) -> float:
    """The heuristic quality of one text, in [0, 1] (see the module docstring).

    Examples
    --------
    >>> heuristic_quality("")
    0.0
    >>> heuristic_quality("The cat sat on the mat. It was happy there.") > 0.7
    True
    """
    words = text.split()
    n = len(words)
    if n == 0:
        return 0.0
    alpha = sum(any(c.isalpha() for c in w) for w in words) / n
    mean_len = sum(len(w) for w in words) / n
    if 3 <= mean_len <= 10:
        length = 1.0
    else:
        length = max(0.0, 1 - min(abs(mean_len - 3), abs(mean_len - 10)) / 3)
    stop = min(1.0, sum(w.lower().strip(".,;:()\"'") in STOP_WORDS for w in words) / n / 0.25)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    ends = sum(bool(_SENTENCE_END.search(ln)) for ln in lines) / len(lines)
    unique = 1 - (len(lines) - len(set(lines))) / len(lines)
    size = min(1.0, len(text) / 1000)
    return round((alpha + length + stop + ends + unique + size) / 6, 6)


def heuristic_quality_batch(texts: Iterable[str]) -> np.ndarray:
    """:func:`heuristic_quality` of every text, as float64."""
    return np.fromiter((heuristic_quality(t) for t in texts), dtype=np.float64)
