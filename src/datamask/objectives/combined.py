"""The selection objective: quality and diversity terms mixed by weight."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._device import seed_streams
from .._validation import check_ratio
from ..budget import TokenBudget
from ..data import Corpus
from . import disf, facility_location, pairwise  # noqa: F401  (register the built-in terms)
from .base import Term, TermContext
from .quality import Quality
from .registry import TERMS, make_term, term_class

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "DEFAULT_LAMB",
    "Objective",
    "group_lamb",
    "resolve_objective",
]

#: The objective when none is given: facility location, quality weighted 0.5. Every
#: default of ``algorithm`` and ``lamb`` (selectors, evaluate, bench, the CLI) is these.
DEFAULT_ALGORITHM = "Facility"
DEFAULT_LAMB = 0.5

#: The ``--algorithm`` names (the reference's ``Facility``, ``Pair_simi``, ``DiSF``, then
#: any registered user term) and their classes: the registry itself, so always current.
ALGORITHMS: dict[str, type[Term]] = TERMS


def _columns_for(
    term: Term, available: Mapping[str, np.ndarray], n: int, where: str
) -> dict[str, np.ndarray]:
    """The extra columns ``term`` requires, each checked present and of ``n`` rows."""
    wanted = {}
    for col in term.requires_columns:
        if col not in available:
            raise ValueError(
                f"term {type(term).__name__} requires the column {col!r}, which was "
                f"not read from {where}; available columns: {sorted(available)}."
            )
        values = np.asarray(available[col])
        if len(values) != n:
            raise ValueError(f"column {col!r} has {len(values)} rows but there are {n} documents.")
        wanted[col] = values
    return wanted


class Objective:
    """``J(S) = lamb * Quality(S) + (1 - lamb) * sum_t w_t D_t(S)``.

    Scales: quality scores are min-max scaled per column to [0, 1] and averaged over S;
    facility location is a mean cosine similarity in [0, 1]; pairwise is
    ``1 - mean pairwise cosine`` (about [0, 1] for real embeddings); DiSF is
    ``1 - mean squared off-diagonal correlation`` in [0, 1]. Every term is "higher is
    better" and none needs rescaling by the data, so ``lamb`` means the same on any corpus.

    Parameters
    ----------
    diversity : Term or sequence of Term
        One or more diversity terms.
    lamb : float, default=0.5
        Weight of the quality term, in [0, 1].
    weights : sequence of float, optional
        Relative weights of the diversity terms (default equal), normalised to sum to 1.
    """

    def __init__(
        self,
        diversity: Term | Sequence[Term],
        lamb: float = DEFAULT_LAMB,
        weights: Sequence[float] | None = None,
    ) -> None:
        self.diversity = [diversity] if isinstance(diversity, Term) else list(diversity)
        if not self.diversity:
            raise ValueError("diversity must hold at least one term; got none.")
        self.lamb = check_ratio("lamb", lamb, low_open=False, high_open=False)
        w = np.ones(len(self.diversity)) if weights is None else np.asarray(weights, float)
        if w.shape != (len(self.diversity),) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be one non-negative number per term; got {weights}.")
        self.quality = Quality()
        self.terms: list[tuple[float, Term]] = [(self.lamb, self.quality)] + [
            ((1.0 - self.lamb) * wi / w.sum(), t) for wi, t in zip(w, self.diversity, strict=True)
        ]

    def __repr__(self) -> str:
        return f"Objective(diversity={self.diversity}, lamb={self.lamb})"

    def bind(
        self,
        corpus: Corpus,
        k: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        columns: Mapping[str, np.ndarray] | None = None,
        max_neighbors: int | None = None,
        budget: TokenBudget | None = None,
    ) -> Objective:
        """Move the corpus to ``device`` and bind every term to its context. Returns self.

        Parameters
        ----------
        corpus : Corpus
            The (checked) documents.
        k : int
            Target subset size.
        device : torch.device or str, default="cpu"
            Compute device.
        seed : int, default=0
            The run's seed. Term ``i`` gets its own :class:`~datamask.objectives.base.
            TermContext` with generators from stream ``1 + i`` of it
            (:func:`datamask._device.seed_streams`; stream 0 is the selector's), so no two
            terms draw the same numbers, one term's draws never shift another's and the
            same seed gives the same result at any N.
        columns : mapping of str to ndarray, optional
            Extra per-document columns; default ``corpus.extra`` when the corpus has it.
            Each term receives the columns it lists in ``requires_columns``.
        max_neighbors : int, optional
            Cap on the default K of graph terms (``TermContext.max_neighbors``); the
            learner passes ``LEARNER_MAX_NEIGHBORS``.
        budget : TokenBudget, optional
            A token budget (:mod:`datamask.budget`): every term counts documents by
            their lengths (``TermContext.sizes``) and ``k`` is the count it is expected
            to keep. Default: a document budget of ``k``.

        Raises
        ------
        ValueError
            A term requires a column that is absent, or a column of the wrong length.
        """
        self.device_ = torch.device(device)
        self.k_ = int(k)
        self.seed_ = int(seed)
        with warnings.catch_warnings():  # a read-only arrow buffer: never written, not copied
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            self.features_ = torch.as_tensor(corpus.features, device=self.device_)
        self.quality_ = torch.as_tensor(
            corpus.normalized_quality(), dtype=torch.float32, device=self.device_
        )
        available = dict(getattr(corpus, "extra", None) or {}) if columns is None else columns
        n = self.features_.shape[0]
        given = getattr(corpus, "floor", None)  # coverage from documents already kept
        floor = None
        if given is not None:
            floor = torch.as_tensor(np.asarray(given), device=self.device_)
            floor = floor.to(self.features_.dtype).clamp_min(0.0)
        sizes = None
        if budget is not None:
            # a copy: the lengths may be a read-only view of an arrow column
            sizes = torch.tensor(budget.sizes, dtype=torch.float64, device=self.device_)
        self.budget_ = budget
        streams = seed_streams(self.seed_, 1 + len(self.terms))
        for i, (_, term) in enumerate(self.terms):
            wanted = _columns_for(term, available, n, getattr(corpus, "source", "the corpus"))
            ctx = TermContext.create(
                self.features_,
                self.quality_,
                self.k_,
                seed=self.seed_,
                stream=streams[1 + i],
                columns=wanted,
                max_neighbors=max_neighbors,
                floor=floor,
                sizes=sizes,
                budget=None if budget is None else budget.total,
            )
            term.bind(ctx)
        return self

    # --- values ------------------------------------------------------------------------------
    def term_values(self, selected: np.ndarray | torch.Tensor) -> dict[str, float]:
        """Each term's exact value and the total ``J`` for the rows ``selected``."""
        sel = torch.as_tensor(np.asarray(selected), dtype=torch.long, device=self.device_)
        values = [t.value(sel) for _, t in self.terms]
        out = dict(zip(self.labels, values, strict=True))
        out["J"] = sum(w * v for (w, _), v in zip(self.terms, values, strict=True))
        return out

    @property
    def labels(self) -> list[str]:
        """One unique key per term: its ``name``, then ``name_2``, ``name_3``, ... for repeats
        (two terms of one class must not share a key, or one would hide the other)."""
        seen: dict[str, int] = {}
        labels = []
        for _, term in self.terms:
            seen[term.name] = seen.get(term.name, 0) + 1
            labels.append(term.name if seen[term.name] == 1 else f"{term.name}_{seen[term.name]}")
        return labels

    def value(self, selected: np.ndarray | torch.Tensor) -> float:
        return self.term_values(selected)["J"]

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """``J`` of each of G masks (shape (G, b)) restricted to the rows ``batch``."""
        return sum(w * t.batch_values(batch, masks) for w, t in self.terms)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        """Differentiable E[J] under independent keep-probabilities ``p``."""
        self._check_expected()
        return sum(w * t.expected(p, clients) for w, t in self.terms)

    def expected_grad(
        self, p: torch.Tensor, clients: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """E[J] and its gradient ``dE[J]/dp`` (shape (n_docs,)) under independent
        keep-probabilities ``p``: each term adds its weighted gradient into one buffer
        (:meth:`~datamask.objectives.base.Term.expected_grad`), no host sync."""
        self._check_expected()
        grad = torch.zeros_like(p)
        value = sum(w * t.expected_grad(p, clients, grad, w) for w, t in self.terms)
        return value, grad

    def _check_expected(self) -> None:
        missing = [type(t).__name__ for _, t in self.terms if not t.has_expected]
        if missing:
            raise NotImplementedError(
                f"{', '.join(missing)} has no expected-value estimator (value-only term); "
                "use estimator='reinforce' (--estimator reinforce) or a greedy selector "
                "(--method greedy)."
            )

    # --- neighbour graphs -----------------------------------------------------------------
    def build_graphs(self) -> None:
        """Build the K-NN graph of every term that has one (timed in its ``graph_seconds_``)."""
        for _, term in self.terms:
            if term.has_graph:
                term.build_graph()

    def graph_seconds(self) -> float:
        """Seconds spent building the terms' neighbour graphs (the sum of their
        :meth:`~datamask.objectives.base.Term.graph_summary` seconds; 0 when none)."""
        built = [t.graph_summary() for _, t in self.terms if t.has_graph]
        return float(sum(g["seconds"] for g in built if g is not None))

    @property
    def submodular(self) -> bool:
        """Whether every term declares itself submodular (stale greedy gains are bounds)."""
        return all(t.submodular for _, t in self.terms)

    # --- greedy ------------------------------------------------------------------------------
    def init_state(self, graph: bool = False) -> list[Any]:
        """Greedy state of every term; ``graph``: facility gains on the K-NN graph."""
        return [t.init_state(graph) for _, t in self.terms]

    def gains(self, state: list[Any], candidates: torch.Tensor) -> torch.Tensor:
        return sum(w * t.gains(s, candidates) for (w, t), s in zip(self.terms, state, strict=True))

    def update(self, state: list[Any], j: int) -> list[Any]:
        return [t.update(s, j) for (_, t), s in zip(self.terms, state, strict=True)]


def resolve_objective(
    objective: Objective | None,
    algorithm: str | Sequence[str] | None,
    lamb: float | None,
    *,
    default_algorithm: str = DEFAULT_ALGORITHM,
    params: Mapping[str, Any] | None = None,
) -> Objective:
    """The one objective factory: ``objective`` as given, or one term per name in
    ``algorithm`` (default :data:`DEFAULT_ALGORITHM`), equally weighted, quality weighted
    ``lamb`` (default :data:`DEFAULT_LAMB`). ``params`` are term settings by name
    (``n_neighbors``, ``knn``, ...): each term takes those it declares. ``objective``
    together with ``algorithm`` or ``lamb`` is refused: they would be silently ignored."""
    if objective is not None:
        if not isinstance(objective, Objective):
            raise TypeError(
                f"objective must be a datamask Objective; got {type(objective).__name__}."
            )
        if algorithm is not None or lamb is not None:
            raise ValueError(
                "give the objective either as objective= or as algorithm/lamb, not both; got "
                f"objective={objective!r} and algorithm={algorithm!r}, lamb={lamb!r}."
            )
        return objective
    names = [algorithm or default_algorithm] if isinstance(algorithm, str | None) else algorithm
    params = dict(params or {})
    terms = []
    for name in names:
        declared = term_class(name, what="algorithm")._parameter_constraints
        terms.append(make_term(name, **{k: v for k, v in params.items() if k in declared}))
    return Objective(terms, lamb=DEFAULT_LAMB if lamb is None else lamb)


def group_lamb(lamb: float, c_group: int, n_group: int, k_total: int, n_total: int) -> float:
    """The ``lamb`` at which a group selecting ``c_group`` of its ``n_group`` rows trades
    quality against coverage at the corpus' rate: the rate of a sharded run's groups
    (:mod:`datamask.distributed.combine.gains`) and of a selection given documents already
    kept (:mod:`datamask.pipeline.given`), whose corpus is the kept and the new documents.

    Quality is a mean over the selection and coverage over the documents, so a unit of
    quality is worth ``lamb / k`` and a unit of coverage ``(1 - lamb) / N`` in the corpus'
    ``J``, and ``lamb_g / c_g`` against ``(1 - lamb_g) / n_g`` in the group's. Equal ratios
    give ``lamb_g / (1 - lamb_g) = lamb / (1 - lamb) * (N / k) * (c_g / n_g)``.

    Examples
    --------
    A group proposing twice its proportional share counts quality twice as much:

    >>> round(group_lamb(0.5, 200, 1000, 1000, 10_000), 4)
    0.6667
    >>> group_lamb(0.5, 100, 1000, 1000, 10_000)
    0.5
    """
    if lamb in (0.0, 1.0):
        return float(lamb)
    odds = lamb / (1.0 - lamb) * (n_total / k_total) * (c_group / n_group)
    return odds / (1.0 + odds)
