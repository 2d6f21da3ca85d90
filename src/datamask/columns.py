"""Which columns hold the id, the quality score(s) and the embedding: :class:`Columns`, the
one value every corpus reader takes, and the presets that name the ecosystem's layouts.

* ``datamask``: ``chunk_id``, ``quality_score``, ``feature_arr`` (the reference's layout).
* ``fineweb-edu``: ``id``, ``score``, ``embedding``. FineWeb-Edu's own columns (``id``,
  ``text``, ``score`` from the edu classifier, ``int_score``) with an ``embedding`` added.
* ``curator``: ``id`` (else ``_curator_dedup_id``, the id Curator's deduplication stages
  assign); the first present of ``fineweb-edu-score-float`` (Curator 1.x's FineWeb-Edu
  classifier), ``fineweb-edu-score`` (its 0.x name), ``quality_score``, ``score``;
  ``embeddings`` (Curator's embedding stages: a list of floats per document).

A name not given is filled once, by :meth:`Columns.resolve` against the input's schema:
from the preset, or with no preset, for each role the first present of its candidates
(``chunk_id``, ``id``; ``quality_score``, ``score``, ``fineweb-edu-score``; ``feature_arr``,
``embedding``, ``embeddings``). Explicit column names always win over a preset.

    >>> cols = Columns(preset="fineweb-edu").resolve(["id", "text", "score", "embedding"])
    >>> cols.id_col, cols.quality_cols, cols.feature_col
    ('id', ('score',), 'embedding')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._validation import Options
from .settings import setting_field

__all__ = ["AUTO", "Columns", "PRESETS", "Preset", "get_preset", "resolve_columns"]


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
        ("fineweb-edu-score-float", "fineweb-edu-score", "quality_score", "score"),
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


def _preset_names() -> tuple:
    return (Options(str, ("auto", *PRESETS)), None)


@dataclass(frozen=True)
class Columns:
    """Which columns hold the id, the quality score(s) and the embedding.

    A name left as None (or no quality column) is filled by :meth:`resolve` from
    ``preset``, else from the input's schema. Every corpus reader takes a resolved value.

    Parameters
    ----------
    id_col : str, optional
        The id column (default: from the preset, else the first of chunk_id, id present).
    quality_cols : tuple of str, default=()
        Quality column(s), mixed by ``quality_weights`` (default: from the preset, else the
        first of quality_score, score, fineweb-edu-score present).
    quality_weights : tuple of float, optional
        One weight per quality column (default: equal).
    feature_col : str, optional
        The embedding column (default: from the preset, else the first of feature_arr,
        embedding, embeddings present).
    preset : {"auto", "datamask", "fineweb-edu", "curator"}, optional
        Column names of a known layout; explicit names win.
    """

    id_col: str | None = setting_field(
        None, (str, None), "id column (default: from --preset, else chunk_id or id)"
    )
    quality_cols: tuple[str, ...] = setting_field(
        (),
        (str,),
        "quality column(s), mixed by quality_weights (default: from --preset, else "
        "quality_score, score or fineweb-edu-score)",
        many=True,
    )
    quality_weights: tuple[float, ...] | None = None
    feature_col: str | None = setting_field(
        None,
        (str, None),
        "embedding column (default: from --preset, else feature_arr, embedding or embeddings)",
    )
    preset: str | None = setting_field(
        None,
        _preset_names,
        "column names of a known layout: datamask (chunk_id, quality_score, feature_arr), "
        "fineweb-edu (id, score, embedding), curator (id, fineweb-edu-score, embeddings); "
        "column flags win (default: auto, detected from the input)",
    )

    @property
    def resolved(self) -> bool:
        """Every name known: what a reader needs."""
        return self.id_col is not None and bool(self.quality_cols) and self.feature_col is not None

    def resolve(
        self,
        names: Sequence[str] | None = None,
        *,
        where: str = "the input",
        rows_as_ids: bool = False,
    ) -> Columns:
        """The names not given, filled from the preset and the input's column ``names``.

        Without a preset, a role none of whose candidates is present gets its first
        candidate (the reader then reports it missing); a named preset raises instead.
        ``names=None`` (no schema known) gives every role not named the first candidate of
        the preset (without one: ``chunk_id``, ``quality_score``, ``feature_arr``).
        ``rows_as_ids``: no id column found means None (the caller numbers the rows), not
        ``chunk_id``. A value already resolved is returned as it is.

        Raises
        ------
        ValueError
            When a role has none of the named preset's candidates in ``names``.
        """
        if self.resolved and self.preset is None:
            return self
        if names is None:
            p = get_preset(self.preset)
            return replace(
                self,
                id_col=self.id_col or p.id_cols[0],
                quality_cols=self.quality_cols or p.quality_cols[:1],
                feature_col=self.feature_col or p.feature_cols[0],
                preset=None,
            )
        id_col, quality_cols, feature_col = resolve_columns(
            names,
            preset=self.preset,
            id_col=self.id_col,
            quality_cols=self.quality_cols or None,
            feature_col=self.feature_col,
            where=where,
        )
        if id_col is None and not rows_as_ids:
            id_col = AUTO.id_cols[0]
        return replace(
            self,
            id_col=id_col,
            quality_cols=tuple(quality_cols),
            feature_col=feature_col,
            preset=None,
        )

    def resolve_id(self, names: Sequence[str], *, where: str = "the input") -> Columns:
        """Only the id column filled (what ``apply`` reads): the name given, else the
        preset's first candidate present in ``names``, else the first of chunk_id, id
        present (none: ``chunk_id``, which the reader reports missing)."""
        if self.id_col is not None:
            return replace(self, preset=None)
        p = get_preset(self.preset)
        return replace(self, id_col=_pick("id", p.id_cols, names, p, where), preset=None)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Columns:
        """Columns from flat keys (``id_col``, ``quality_col`` as ``NAME`` or
        ``NAME:WEIGHT`` specs, ``quality_cols``, ``quality_weights``, ``feature_col``,
        ``preset``); None means "not named"."""
        given = split_quality({k: v for k, v in values.items() if v is not None})
        for name in ("quality_cols", "quality_weights"):
            if given.get(name) is not None:
                given[name] = tuple(given[name])
        return cls(**given)

    def to_mapping(self) -> dict[str, Any]:
        """The flat keys of these columns, as a spec's ``from_mapping`` takes them."""
        out = {
            "id_col": self.id_col,
            "quality_cols": self.quality_cols or None,
            "quality_weights": self.quality_weights,
            "feature_col": self.feature_col,
            "preset": self.preset,
        }
        return {k: v for k, v in out.items() if v is not None}

    @property
    def read(self) -> list[str]:
        """Columns read from every input, each once (of a resolved value)."""
        named = [self.id_col, *self.quality_cols, self.feature_col]
        return list(dict.fromkeys(c for c in named if c is not None))


def split_quality(values: Mapping[str, Any]) -> dict[str, Any]:
    """``quality_col`` (``NAME`` / ``NAME:WEIGHT`` specs or pairs, as the flag takes them)
    replaced by ``quality_cols`` and ``quality_weights``; other keys kept.

    >>> split_quality({"quality_col": ["edu:2", "quality_score"]})
    {'quality_cols': ['edu', 'quality_score'], 'quality_weights': [2.0, 1.0]}
    """
    out = dict(values)
    if out.get("quality_col") is None:
        out.pop("quality_col", None)
        return out
    specs = out.pop("quality_col")
    pairs = [
        quality_spec(v) if isinstance(v, str) else (str(v[0]), float(v[1]))
        for v in (specs if isinstance(specs, list | tuple) else [specs])
    ]
    out["quality_cols"] = [name for name, _ in pairs]
    if any(w != 1.0 for _, w in pairs):
        if out.get("quality_weights") is not None:
            raise ValueError(
                "give the quality weights either as NAME:WEIGHT or as quality_weights, not "
                f"both; got {list(specs)} and {list(out['quality_weights'])}."
            )
        out["quality_weights"] = [w for _, w in pairs]
    return out


def quality_spec(text: str) -> tuple[str, float]:
    """``name`` or ``name:weight`` -> (name, weight).

    >>> quality_spec("edu:2"), quality_spec("quality_score")
    (('edu', 2.0), ('quality_score', 1.0))
    """
    name, sep, weight = text.rpartition(":")
    if not sep:
        return text, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise ValueError(f"--quality-col takes NAME or NAME:WEIGHT; got {text!r}.") from None
    if not value >= 0:
        raise ValueError(f"quality weight must be >= 0; got {text!r}.")
    return name, value
