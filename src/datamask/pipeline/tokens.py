"""What a token budget reads and records at the door of one file: the length column and
the summary's ``tokens`` block (:mod:`datamask.budget`; the sharded runner's manifest
mirrors it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..budget import length_column, resolve_token_budget
from ..config import SelectSpec
from ..data import Corpus

__all__ = ["token_length_column", "token_summary"]


def token_summary(
    spec: SelectSpec, corpus: Corpus, selected: np.ndarray, names: list[str]
) -> dict[str, Any]:
    """What a token budget kept: the tokens kept, the budget, the corpus' tokens and the
    column they were read from (every output records it)."""
    sel = spec.selector
    budget = resolve_token_budget(
        corpus.lengths, sel.budget_tokens, sel.select_token_ratio, corpus.source
    )
    return {
        "kept": budget.tokens(selected),
        "budget": budget.total,
        "corpus": float(budget.sizes.sum()),
        "length_col": token_length_column(spec, names, corpus.source),
    }


def token_length_column(spec: SelectSpec, names: list[str], where: str) -> str | None:
    """The column a token budget reads (``--length-col``, else the first length column
    present), or None under a document budget."""
    if not spec.selector.token_budget:
        return None
    return length_column(names, spec.selector.length_col, where)
