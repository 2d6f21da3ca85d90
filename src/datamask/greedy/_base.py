"""What every baseline selector shares: parameters, validation, binding, the fitted result.

A selector stores its parameters in ``__init__`` and does all the work in ``fit``, like
:class:`~datamask.optim.MaskLearner`; results end in ``_``. Subclasses implement
:meth:`BaseSelector._select`, which returns the picked rows in pick order (or any order
with per-row scores).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from .._device import make_generators, resolve_device
from .._validation import DEFAULT_SELECT_RATIO, check_corpus, check_ratio, resolve_k
from ..data import Corpus, Selection, top_k_rows
from ..near_duplicates import (
    SimilarityCap,
    capped_top_k,
    check_max_similarity,
    infeasible_message,
    verify_cap,
)
from ..objectives import Objective
from ..objectives.combined import DEFAULT_ALGORITHM, resolve_objective

__all__ = ["BaseSelector", "GreedyTrace", "pick_order_scores"]


def pick_order_scores(order: np.ndarray, n_docs: int) -> np.ndarray:
    """Scores from a pick order: the t-th pick scores ``-t``, rows never picked ``-n_docs``.

    Higher is better, so ranking by score replays the pick order.
    """
    scores = np.full(n_docs, -float(n_docs))
    scores[np.asarray(order, dtype=np.int64)] = -np.arange(len(order), dtype=np.float64)
    return scores


class GreedyTrace:
    """Records a greedy run: the pick order, and the running objective every few picks.

    The running objective is the sum of the marginal gains so far; :meth:`history` shifts
    it so that the last point equals the exact final ``J``.
    """

    def __init__(self, k: int, start: float, points: int = 50) -> None:
        self.order: list[int] = []
        self.every = max(1, k // points)
        self.k = k
        self.start = start
        self._gain_sum = 0.0
        self._points: list[dict[str, float]] = []

    def add(self, j: int, gain: float) -> None:
        self.order.append(int(j))
        self._gain_sum += float(gain)
        t = len(self.order)
        if t % self.every == 0 or t == self.k:
            self._points.append(
                {"step": t, "gain_sum": self._gain_sum, "seconds": time.perf_counter() - self.start}
            )

    def history(self, final_j: float) -> list[dict[str, float]]:
        """Per logged pick: step, running objective (J of the picks so far), seconds."""
        offset = final_j - self._gain_sum  # the objective of the empty selection
        return [
            {"step": p["step"], "objective": float(offset + p["gain_sum"]), "seconds": p["seconds"]}
            for p in self._points
        ]


class BaseSelector:
    """Shared parameters and bookkeeping of the baseline selectors.

    Parameters
    ----------
    objective : Objective, optional
        What the selection is scored with (and, for the greedy selectors, what they
        maximise). Default: ``Objective(make_diversity(algorithm), lamb=lamb)``.
    algorithm : str, optional
        Diversity term (a registered name) when ``objective`` is not given. Default
        ``default_algorithm`` (``Facility``; ``DiSF`` for ``disf-greedy``).
    lamb : float, optional
        Quality weight when ``objective`` is not given, in [0, 1]. Default 0.5. Giving
        ``algorithm`` or ``lamb`` with ``objective`` is an error (they would be ignored).
    select_ratio : float, default=0.3
        Fraction of documents kept, in (0, 1); exactly ``round(select_ratio * n)`` are.
    k : int, optional
        Keep exactly this many documents instead (1 <= k <= n).
    seed : int, default=0
        Seeds every random draw.
    device : str, default="auto"
        "auto", "cpu", "cuda" or "cuda:N".
    progress : bool, default=False
        Show a progress bar over the picks.
    max_similarity : float, optional
        Hard cap: no two selected documents have cosine similarity above it (default: no
        cap). Greedy selectors skip candidates that conflict with a kept document; ranking
        selectors walk down their ranking; ValueError when fewer than k are compatible.
    """

    #: The ``--method`` name of the selector.
    method: ClassVar[str] = ""
    #: The selector's own parameters and what each accepts (the CLI's flags are made from
    #: it); the shared ones above are the fields of :class:`datamask.config.SelectorSpec`.
    _parameter_constraints: ClassVar[dict[str, list]] = {}
    #: The diversity term when neither ``objective`` nor ``algorithm`` is given.
    default_algorithm: ClassVar[str] = DEFAULT_ALGORITHM

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        algorithm: str | None = None,
        lamb: float | None = None,
        select_ratio: float = DEFAULT_SELECT_RATIO,
        k: int | None = None,
        seed: int = 0,
        device: str = "auto",
        progress: bool = False,
        max_similarity: float | None = None,
    ) -> None:
        self.objective = objective
        self.algorithm = algorithm
        self.lamb = lamb
        self.select_ratio = select_ratio
        self.k = k
        self.seed = seed
        self.device = device
        self.progress = progress
        self.max_similarity = max_similarity

    def __repr__(self) -> str:
        return f"{type(self).__name__}(select_ratio={self.select_ratio}, seed={self.seed})"

    # ----------------------------------------------------------------------------------------
    def _check_params(self) -> None:
        """Check the subclass' own parameters (called before any work)."""

    def _setup(self, corpus: Corpus) -> Objective:
        """Validate, resolve k and the device, bind the objective. Returns the bound objective."""
        check_ratio("select_ratio", self.select_ratio)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise TypeError(f"seed must be an integer; got {self.seed!r}.")
        objective = resolve_objective(
            self.objective, self.algorithm, self.lamb, default_algorithm=self.default_algorithm
        )
        self._check_params()
        check_max_similarity(self.max_similarity)
        check_corpus(corpus)
        self.device_ = resolve_device(self.device)
        n = corpus.n_docs
        self.k_ = resolve_k(self.select_ratio, n, self.k)
        self.objective_ = objective.bind(corpus, self.k_, self.device_, seed=self.seed)
        self._torch_gen, self._np_rng = make_generators(int(self.seed), self.device_)
        self._cap = (
            None
            if self.max_similarity is None
            else SimilarityCap(self.objective_.features_, self.max_similarity, capacity=self.k_)
        )
        return self.objective_

    # --- the max_similarity cap (no-ops without one) --------------------------------------
    def _capped(self, row: int) -> bool:
        """Whether the cap refuses ``row`` (greedy selectors then drop it from the pool)."""
        return self._cap is not None and not self._cap.admit(row)

    def _check_left(self, picked: int, n_docs: int) -> None:
        """Raise the infeasible-cap error once every row is picked or refused."""
        if self._cap is not None and picked + self._cap.n_refused >= n_docs:
            raise ValueError(
                infeasible_message(
                    self.max_similarity, picked, self.k_, n_docs, f"{self.method}'s candidates"
                )
            )

    def _top_k(self, scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The k best scores (ties by id); under the cap, the k best compatible ones."""
        if self.max_similarity is None:
            return top_k_rows(scores, ids, self.k_)
        return capped_top_k(
            scores,
            ids,
            self.k_,
            self.objective_.features_,
            self.max_similarity,
            what=f"{self.method}'s ranking",
        )

    def _bar(self, total: int, *, desc: str | None = None, unit: str = "pick") -> tqdm:
        return tqdm(
            total=total,
            disable=not self.progress,
            desc=desc or self.method or "select",
            unit=unit,
            dynamic_ncols=True,
        )

    def fit(self, corpus: Corpus) -> BaseSelector:
        """Select exactly k rows of ``corpus``. Returns self."""
        start = time.perf_counter()
        self._start = start
        objective = self._setup(corpus)
        selected, scores = self._select(corpus, objective)
        selected = np.sort(np.asarray(selected, dtype=np.int64))
        if len(selected) != self.k_ or len(np.unique(selected)) != self.k_:  # internal bug guard
            raise RuntimeError(
                f"{type(self).__name__} selected {len(np.unique(selected))} rows, not k={self.k_}."
            )
        if self.max_similarity is not None:  # exact check before anything is written
            self.max_pair_similarity_ = verify_cap(
                self.objective_.features_, selected, self.max_similarity
            )
        self.selected_ = selected
        self.scores_ = np.asarray(scores, dtype=np.float64)
        self.fit_seconds_ = time.perf_counter() - start  # selection only, not its evaluation
        self.graph_seconds_ = self.objective_.graph_info()["graph_seconds"]
        self.optimise_seconds_ = self.fit_seconds_ - self.graph_seconds_
        self.terms_ = self.objective_.term_values(self.selected_)
        trace = getattr(self, "_trace", None)
        self.history_: list[dict[str, Any]] = (
            trace.history(self.terms_["J"]) if trace is not None else []
        )
        return self

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Return (selected rows, per-row scores). Implemented by each selector."""
        raise NotImplementedError

    def selection(self) -> Selection:
        """The fitted result as a :class:`~datamask.data.Selection`."""
        return Selection(
            selected=self.selected_,
            scores=self.scores_,
            meta={"method": self.method, "terms": self.terms_, "seconds": self.fit_seconds_},
        )


def to_numpy(x: torch.Tensor) -> np.ndarray:
    """A CPU numpy copy of ``x`` (a sync point on CUDA)."""
    return x.detach().cpu().numpy()
