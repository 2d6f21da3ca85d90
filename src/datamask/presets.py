"""Column-name presets: the id, quality and embedding columns of the ecosystem's layouts.

* ``datamask``: ``chunk_id``, ``quality_score``, ``feature_arr`` (the reference's layout).
* ``fineweb-edu``: ``id``, ``score``, ``embedding``. FineWeb-Edu's own columns (``id``,
  ``text``, ``score`` from the edu classifier, ``int_score``) with an ``embedding`` added.
* ``curator``: ``id`` (else ``_curator_dedup_id``, the id Curator's deduplication stages
  assign); the first present of ``fineweb-edu-score`` (Curator's FineWeb-Edu classifier),
  ``quality_score``, ``score``; ``embeddings`` (Curator's ``EmbeddingCreator``).

With no preset and no column flags, :func:`resolve_columns` detects the columns from the
schema: for each role the first present of its candidates (``chunk_id``, ``id``;
``quality_score``, ``score``, ``fineweb-edu-score``; ``feature_arr``, ``embedding``,
``embeddings``). Explicit column names always win over a preset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Preset", "PRESETS", "AUTO", "get_preset", "resolve_columns"]


@dataclass(frozen=True)
class Preset:
    """Candidate column names per role, the first present one is used.

    Attributes
    ----------
    name : str
        The preset's name, as given to ``--preset``.
    id_cols, quality_cols, feature_cols : tuple of str
        Candidates for the id, quality and embedding columns, in order of preference.
    """

    name: str
    id_cols: tuple[str, ...]
    quality_cols: tuple[str, ...]
    feature_cols: tuple[str, ...]


PRESETS: dict[str, Preset] = {
    "datamask": Preset("datamask", ("chunk_id",), ("quality_score",), ("feature_arr",)),
    "fineweb-edu": Preset("fineweb-edu", ("id",), ("score",), ("embedding",)),
    "curator": Preset(
        "curator",
        ("id", "_curator_dedup_id"),
        ("fineweb-edu-score", "quality_score", "score"),
        ("embeddings",),
    ),
}

#: What an unspecified column falls back to: every preset's candidates, datamask's first.
AUTO = Preset(
    "auto",
    ("chunk_id", "id"),
    ("quality_score", "score", "fineweb-edu-score"),
    ("feature_arr", "embedding", "embeddings"),
)


def get_preset(name: str | None) -> Preset:
    """The preset called ``name`` (None -> the automatic detection)."""
    if name is None or name == "auto":
        return AUTO
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {['auto', *PRESETS]}; got {name!r}.")
    return PRESETS[name]


def _pick(
    role: str, candidates: Sequence[str], names: Sequence[str], preset: Preset, where: str
) -> str:
    for c in candidates:
        if c in names:
            return c
    if preset is AUTO:  # nothing to detect: the reader names the default column as missing
        return candidates[0]
    flag = {"id": "--id-col", "quality": "--quality-col", "embedding": "--feature-col"}[role]
    raise ValueError(
        f"no {role} column of preset {preset.name!r} ({list(candidates)}) found in {where}; "
        f"available columns: {list(names)}. Name it with {flag}."
    )


def resolve_columns(
    names: Sequence[str],
    *,
    preset: str | None = None,
    id_col: str | None = None,
    quality_cols: Sequence[str] | None = None,
    feature_col: str | None = None,
    where: str = "the input",
) -> tuple[str | None, list[str], str]:
    """Fill the column names not given from ``preset`` and the schema's ``names``.

    Parameters
    ----------
    names : sequence of str
        The input's column names.
    preset : {"auto", "datamask", "fineweb-edu", "curator"} or None, default=None
        None and ``"auto"`` take, per role, the first present of every preset's candidates.
    id_col, quality_cols, feature_col : optional
        Names given explicitly; kept as they are (their presence is checked by the reader).
    where : str
        Names the input in error messages.

    Returns
    -------
    id_col : str or None
        None only in auto mode when no id column exists (the caller may number the rows).
    quality_cols : list of str
    feature_col : str

    Raises
    ------
    ValueError
        When a role has none of the named preset's candidates in ``names`` (in auto mode
        the default name is returned and the reader reports it missing).
    """
    p = get_preset(preset)
    if id_col is None:
        auto_ok = p is AUTO and not any(c in names for c in p.id_cols)
        id_col = None if auto_ok else _pick("id", p.id_cols, names, p, where)
    if not quality_cols:
        quality_cols = [_pick("quality", p.quality_cols, names, p, where)]
    if feature_col is None:
        feature_col = _pick("embedding", p.feature_cols, names, p, where)
    return id_col, list(quality_cols), feature_col
