"""Token budgets: keep documents of different lengths under one budget of tokens.

A document budget keeps ``k`` documents; a token budget keeps documents whose lengths
(tokens, or characters or bytes when that is what the corpus has: ``--length-col``) sum
to at most ``T`` and to within one document of it. How the objective counts a long
document against a short one is in docs/method.md "Token budgets": quality per token
kept, coverage per token of the corpus, so cutting a document in two changes nothing.

Every selector reaches the budget through :class:`TokenBudget`: its :meth:`~TokenBudget.
fill` turns a ranking into a selection (top-k quality, random, the learner's rounding),
the lazy greedy prices gains per token, and the swap search keeps its swaps inside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LENGTH_COLUMNS",
    "TOKEN_FLAGS",
    "TokenBudget",
    "budget_total",
    "check_lengths",
    "length_column",
    "resolve_token_budget",
]

#: The settings that ask for a token budget, as the CLI spells them (for errors).
TOKEN_FLAGS = "--budget-tokens / --select-token-ratio"
#: Length columns looked for when ``--length-col`` is not given, in order of preference.
LENGTH_COLUMNS = ("n_chars", "length", "n_tokens", "text")


def length_column(names: list[str], length_col: str | None, where: str) -> str:
    """The column a token budget reads: ``length_col`` (which must be in ``names``), else
    the first of :data:`LENGTH_COLUMNS` present; a ValueError naming the flags if none."""
    if length_col is not None:
        if length_col not in names:
            raise ValueError(
                f"--length-col {length_col!r} not found in {where}; available columns: {names}."
            )
        return length_col
    found = next((c for c in LENGTH_COLUMNS if c in names), None)
    if found is None:
        raise ValueError(
            f"{TOKEN_FLAGS} needs each document's length, and {where} has none of the "
            f"length columns looked for ({list(LENGTH_COLUMNS)}); name the column of token "
            f"(or character) counts with --length-col. Available columns: {names}."
        )
    return found


def check_lengths(lengths: np.ndarray, where: str, first_row: int = 0) -> np.ndarray:
    """``lengths`` as float64 if every one is a finite number > 0, else a ValueError that
    names the first bad row of ``where`` (a document of no tokens costs nothing and would
    be kept for its coverage alone, so it is refused rather than guessed at)."""
    values = np.asarray(lengths, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"lengths must be one number per document; got shape {values.shape}.")
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        rows = np.flatnonzero(bad)
        row = int(rows[0])
        raise ValueError(
            f"the length column of {where} has {len(rows)} value(s) that are not numbers > 0 "
            f"(first at row {first_row + row}: {float(values[row])!r}); a token budget needs every "
            "document's length: drop empty documents or fill the column first."
        )
    return values


@dataclass(frozen=True)
class TokenBudget:
    """``total`` tokens to keep among documents of ``sizes`` tokens each.

    Attributes
    ----------
    sizes : ndarray of float64, shape (n_docs,)
        Each document's length, > 0.
    total : float
        The budget: the kept documents' lengths sum to at most this.
    """

    sizes: np.ndarray
    total: float

    @property
    def n_docs(self) -> int:
        return len(self.sizes)

    def expected_count(self) -> int:
        """About how many documents the budget keeps (``T / mean length``, within [1, n]):
        what a document budget's ``k`` stands for where a method needs a count (the
        learner's steps and graph width)."""
        mean = float(self.sizes.mean())
        return int(min(self.n_docs, max(1, round(self.total / mean))))

    def tokens(self, rows: np.ndarray) -> float:
        """The tokens of ``rows``, summed in float64."""
        return float(self.sizes[np.asarray(rows, dtype=np.int64)].sum())

    def fill(self, order: np.ndarray, admit=None, left: float | None = None) -> np.ndarray:
        """Walk ``order`` (rows, best first) and keep each row that still fits the budget
        (and that ``admit(row)`` accepts, when given). Returns the kept rows in walk order.
        ``left``: the tokens still free (default: the whole budget).

        Rows that do not fit are passed over, not the end of the walk: a shorter one further
        down may fit, so the kept tokens end within the shortest unkept length of ``total``,
        and so within one document's length."""
        sizes = self.sizes
        left = self.total if left is None else float(left)
        smallest = float(sizes.min())
        kept: list[int] = []
        for row in np.asarray(order, dtype=np.int64).tolist():
            if left < smallest:
                break
            size = sizes[row]
            if size <= left and (admit is None or admit(row)):
                kept.append(row)
                left -= size
        return np.asarray(kept, dtype=np.int64)

    def check(self, rows: np.ndarray, method: str) -> None:
        """Internal guard of every fit: the kept tokens are within the budget."""
        used = self.tokens(rows)
        if used > self.total * (1 + 1e-12):
            raise RuntimeError(
                f"{method} kept {used:.0f} tokens, over the budget {self.total:.0f}."
            )


def budget_total(
    budget_tokens: float | None,
    select_token_ratio: float | None,
    corpus: float,
    shortest: float,
    where: str,
) -> float:
    """T of the settings for a corpus of ``corpus`` tokens whose shortest document has
    ``shortest``: ``budget_tokens``, or ``select_token_ratio * corpus``; a ValueError naming
    the flag when T keeps no document or every one. What one file
    (:func:`resolve_token_budget`) and shards (their counted tokens) both resolve."""
    flag = "--budget-tokens" if budget_tokens is not None else "--select-token-ratio"
    if budget_tokens is not None:
        total = float(budget_tokens)
        if not (math.isfinite(total) and total > 0):
            raise ValueError(f"budget_tokens must be > 0; got {budget_tokens!r}.")
    else:
        total = float(select_token_ratio) * corpus
    if total < shortest:
        raise ValueError(
            f"{flag}: a budget of {total:.0f} tokens is shorter than every document of {where} "
            f"(the shortest has {shortest:.0f}); it would keep nothing."
        )
    if total >= corpus:
        raise ValueError(
            f"{flag}: a budget of {total:.0f} tokens holds all {corpus:.0f} tokens of "
            f"{where}; there is nothing to select. Lower it."
        )
    return total


def resolve_token_budget(
    lengths: np.ndarray | None,
    budget_tokens: float | None,
    select_token_ratio: float | None,
    where: str,
) -> TokenBudget | None:
    """The :class:`TokenBudget` of the settings, or None for a document budget.

    ``budget_tokens`` is T itself; ``select_token_ratio`` a share of the corpus' tokens
    (``T = ratio * sum(lengths)``). Raises ValueError naming the flag when both are given,
    when the corpus has no lengths, or when T keeps no document or every one.
    """
    if budget_tokens is None and select_token_ratio is None:
        return None
    if budget_tokens is not None and select_token_ratio is not None:
        raise ValueError(
            "give the token budget either as budget_tokens or as select_token_ratio, not "
            f"both; got {budget_tokens} and {select_token_ratio}."
        )
    flag = "--budget-tokens" if budget_tokens is not None else "--select-token-ratio"
    if lengths is None:
        raise ValueError(
            f"{flag} needs each document's length, and {where} was read without one: name "
            "the column of token (or character) counts with --length-col."
        )
    sizes = check_lengths(lengths, where)
    total = budget_total(
        budget_tokens, select_token_ratio, float(sizes.sum()), float(sizes.min()), where
    )
    return TokenBudget(sizes, total)
