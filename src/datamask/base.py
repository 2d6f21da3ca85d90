"""The one selector contract: parameters, their checks, the fit tail and the fitted result.

Every ``--method`` is a :class:`Selector`, the learner included. As in scikit-learn,
``__init__`` only stores; :meth:`Selector.fit` checks every parameter against the class'
constraint tables (:attr:`Selector._shared_constraints`, what every method takes, and
:attr:`Selector._parameter_constraints`, the method's own), binds a copy of the objective
(the caller's is left as given) and calls :meth:`Selector._select`; the tail (exact cap
check, timings, ``terms_``) is shared. Results end in ``_``.

What a caller may assume about a method is a class flag, not a name it compares:
:attr:`Selector.modular` (a document's score does not depend on the others).
"""

from __future__ import annotations

import copy
import time
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from ._device import make_generators, resolve_device, seed_streams
from ._validation import (
    DEFAULT_SELECT_RATIO,
    SEED,
    Interval,
    check_corpus,
    resolve_k,
    validate_params,
)
from .budget import TOKEN_FLAGS, TokenBudget, resolve_token_budget
from .data import Corpus, Selection, rank_order, top_k_rows
from .near_duplicates import SimilarityCap, capped_top_k, infeasible_message, verify_cap
from .objectives import Objective
from .objectives.combined import DEFAULT_ALGORITHM, resolve_objective

__all__ = ["Selector"]


def _copy_to_bind(objective: Objective) -> Objective:
    """A copy of the caller's ``objective`` for one fit to bind. The tensors and arrays it
    and its terms hold (a given neighbour graph, an earlier bind's state) are shared, not
    copied: binding reads them and replaces the attributes, never writes into them."""
    owners = [objective, *(term for _, term in objective.terms)]
    owners += [vars(o)["ctx_"] for o in owners[1:] if "ctx_" in vars(o)]
    shared: dict[int, Any] = {}
    for owner in owners:
        for value in vars(owner).values():
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, torch.Tensor | np.ndarray):
                    shared[id(item)] = item
    return copy.deepcopy(objective, shared)


class Selector:
    """What every selector shares: its parameters, their checks and the fitted result.

    Parameters
    ----------
    objective : Objective, optional
        What the selection is scored with (and what the learner and the greedy selectors
        maximise). Default: ``Objective(make_term(algorithm), lamb=lamb)``.
    algorithm : str, optional
        Diversity term (a registered name: the reference's ``Facility``, ``Pair_simi``,
        ``DiSF``, or a user term) when ``objective`` is not given. Default
        ``default_algorithm`` (``Facility``; ``DiSF`` for ``disf-greedy``).
    lamb : float, optional
        Quality weight when ``objective`` is not given, in [0, 1]. Default 0.5. Giving
        ``algorithm`` or ``lamb`` with ``objective`` is an error (they would be ignored).
    select_ratio : float, default=0.3
        Fraction of documents kept, in (0, 1); exactly ``round(select_ratio * n)`` are.
    k : int, optional
        Keep exactly this many documents instead (1 <= k <= n).
    budget_tokens : float, optional
        Keep documents whose lengths (``Corpus.lengths``) sum to at most this many tokens,
        and to within one document of it, instead of a number of documents
        (:mod:`datamask.budget`; docs/method.md "Token budgets").
    select_token_ratio : float, optional
        The token budget as a share of the corpus' tokens, in (0, 1).
    seed : int, default=0
        Seeds every random draw: the selector and each term of the objective draw from
        their own child of ``numpy.random.SeedSequence(seed)``.
    device : str, default="auto"
        "auto", "cpu", "cuda" or "cuda:N".
    progress : bool, default=False
        Show a progress bar.
    max_similarity : float, optional
        Hard cap: no two selected documents have cosine similarity above it (default: no
        cap). Greedy selectors skip candidates that conflict with a kept document; ranking
        selectors walk down their ranking; ValueError when fewer than k are compatible.

    Examples
    --------
    A selector implements :meth:`_select`; checks, binding and the fitted result are here:

    >>> import numpy as np
    >>> from datamask import make_clustered
    >>> class FirstRows(Selector):
    ...     method = "first-rows"
    ...     def _select(self, corpus, objective):
    ...         return np.arange(self.k_), -np.arange(corpus.n_docs, dtype=float)
    >>> sel = FirstRows(select_ratio=0.1, device="cpu").fit(make_clustered(50, 4, 2))
    >>> sel.selected_.tolist(), sorted(sel.terms_)
    ([0, 1, 2, 3, 4], ['J', 'facility', 'quality'])
    >>> sel.transform(make_clustered(50, 4, 2)).n_docs  # the selected rows, as a Corpus
    5
    >>> FirstRows(select_ratio=1.5).check_params()
    Traceback (most recent call last):
    ...
    ValueError: select_ratio must be in (0, 1); got 1.5.
    """

    #: The ``--method`` name of the selector.
    method: ClassVar[str] = ""
    #: A document's score does not depend on the other documents (top-k quality, random):
    #: scores of separate groups compare, so a sharded run merges them exactly with
    #: :meth:`comparable_scores` instead of selecting again.
    modular: ClassVar[bool] = False
    #: The diversity term when neither ``objective`` nor ``algorithm`` is given.
    default_algorithm: ClassVar[str] = DEFAULT_ALGORITHM
    #: Cap on the default K of a graph term (None: the term's own default).
    max_neighbors: ClassVar[int | None] = None
    #: The parameters every selector takes and what each accepts (``objective``,
    #: ``algorithm`` and ``lamb`` are checked by the objective factory,
    #: :func:`~datamask.objectives.combined.resolve_objective`).
    _shared_constraints: ClassVar[dict[str, list]] = {
        "select_ratio": [Interval(float, 0, 1, closed="neither")],
        "k": [Interval(int, 0, None, closed="neither"), None],
        "budget_tokens": [Interval(float, 0, None, closed="neither"), None],
        "select_token_ratio": [Interval(float, 0, 1, closed="neither"), None],
        "seed": [SEED],
        "device": "no_validation",  # resolve_device names every wrong form
        "progress": [bool],
        "max_similarity": [Interval(float, -1, 1, closed="right"), None],
    }
    #: The method's own parameters and what each accepts (the CLI's flags are made from
    #: it); the shared ones are the fields of :class:`datamask.config.SelectorSpec`.
    _parameter_constraints: ClassVar[dict[str, list]] = {}

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        algorithm: str | None = None,
        lamb: float | None = None,
        select_ratio: float = DEFAULT_SELECT_RATIO,
        k: int | None = None,
        budget_tokens: float | None = None,
        select_token_ratio: float | None = None,
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
        self.budget_tokens = budget_tokens
        self.select_token_ratio = select_token_ratio
        self.seed = seed
        self.device = device
        self.progress = progress
        self.max_similarity = max_similarity

    def __repr__(self) -> str:
        return f"{type(self).__name__}(select_ratio={self.select_ratio}, seed={self.seed})"

    # --- parameters ------------------------------------------------------------------------
    #: The constructor parameters that choose the objective (checked by
    #: :func:`~datamask.objectives.combined.resolve_objective`, not by the tables).
    _objective_params: ClassVar[tuple[str, ...]] = ("objective", "algorithm", "lamb")

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Every constructor parameter, as set (scikit-learn's contract).

        ``type(self)(**self.get_params(deep=False))`` builds an equal, unfitted selector,
        which is what ``sklearn.base.clone`` does. ``deep=True`` adds, as scikit-learn
        does, ``name__param`` for each parameter value that has its own ``get_params``.
        """
        names = [*self._objective_params, *self._shared_constraints, *self._parameter_constraints]
        out = {name: getattr(self, name) for name in names}
        if deep:
            for name, value in list(out.items()):
                if hasattr(value, "get_params") and not isinstance(value, type):
                    out.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return out

    def set_params(self, **params: Any) -> Selector:
        """Set constructor parameters by name (``name__param`` for a nested one). Returns
        self. Nothing is checked until :meth:`fit`, as in scikit-learn.

        >>> from datamask.ranking import TopKQuality
        >>> TopKQuality().set_params(select_ratio=0.2, seed=3).get_params()["select_ratio"]
        0.2
        """
        valid = self.get_params(deep=False)
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"Invalid parameter {name!r} for {type(self).__name__}; valid parameters: "
                    f"{list(valid)}."
                )
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        return self

    def check_params(self) -> None:
        """Check every parameter against its table, then the rules between parameters.

        Raises ValueError or TypeError naming the parameter, before any work.
        """
        table = {**self._shared_constraints, **self._parameter_constraints}
        validate_params(type(self).__name__, table, {name: getattr(self, name) for name in table})
        self._check_param_rules()

    def _check_param_rules(self) -> None:
        """Rules no single parameter's table can state (e.g. ``min_lr <= max_lr``)."""

    # --- fit -------------------------------------------------------------------------------
    def fit(self, corpus: Corpus, *, evaluate: bool = True) -> Selector:
        """Select exactly k rows of ``corpus``. Returns self.

        ``evaluate=False`` skips scoring the selection with the exact objective (an
        ``n x k`` pass): ``terms_`` is then empty and a greedy's ``history_`` too. A
        sharded run's group step does so; its J is the corpus', not the group's.
        """
        start = self._start = time.perf_counter()
        corpus = self._setup(corpus)  # the checked copy; the caller's corpus is left as is
        self.history_: list[dict[str, Any]] = []
        self._trace: Any = None  # a greedy's GreedyTrace: its history needs the final J
        selected, scores = self._select(corpus, self.objective_)
        selected = np.sort(np.asarray(selected, dtype=np.int64))
        self._check_selected(selected)
        if self.max_similarity is not None:  # exact check before anything is written
            self.max_pair_similarity_ = verify_cap(
                self.objective_.features_, selected, self.max_similarity
            )
        self.selected_ = selected
        self.n_docs_ = corpus.n_docs
        self.scores_ = np.asarray(scores, dtype=np.float64)
        self.fit_seconds_ = time.perf_counter() - start  # selection only, not its evaluation
        self.graph_seconds_ = self.objective_.graph_seconds()
        self.optimise_seconds_ = self.fit_seconds_ - self.graph_seconds_
        scored = time.perf_counter()
        self.terms_ = self.objective_.term_values(self.selected_) if evaluate else {}
        self.evaluate_seconds_ = time.perf_counter() - scored  # the exact J: n x k
        if self._trace is not None and evaluate:
            self.history_ = self._trace.history(self.terms_["J"])
        return self

    def _check_selected(self, selected: np.ndarray) -> None:
        """Internal guard: k distinct rows, or distinct rows within the token budget (whose
        count and tokens become ``k_`` and ``tokens_``)."""
        unique = len(np.unique(selected))
        if self.budget_ is not None and unique == len(selected):
            self.budget_.check(selected, type(self).__name__)
            self.k_ = len(selected)
            self.tokens_ = self.budget_.tokens(selected)
        elif len(selected) != self.k_ or unique != self.k_:
            raise RuntimeError(f"{type(self).__name__} selected {unique} rows, not k={self.k_}.")

    def transform(self, corpus: Corpus) -> Corpus:
        """The selected rows of ``corpus``, the corpus ``fit`` saw, as a new
        :class:`~datamask.data.Corpus` in row order (apricot's ``transform``).

        Raises
        ------
        RuntimeError
            When the selector is not fitted.
        ValueError
            When ``corpus`` has another number of rows than the fitted one.
        """
        if not hasattr(self, "selected_"):
            raise RuntimeError(
                f"this {type(self).__name__} is not fitted yet; call fit(corpus) before "
                "transform(corpus), or use fit_transform(corpus)."
            )
        if corpus.n_docs != self.n_docs_:
            raise ValueError(
                f"corpus has {corpus.n_docs} rows, but this {type(self).__name__} was fitted "
                f"on {self.n_docs_}; transform the corpus it was fitted on."
            )
        return corpus.take(self.selected_)

    def fit_transform(self, corpus: Corpus) -> Corpus:
        """``fit(corpus)``, then the selected rows of ``corpus`` (:meth:`transform`)."""
        return self.fit(corpus).transform(corpus)

    def _setup(self, corpus: Corpus) -> Corpus:
        """Check the parameters and the corpus, resolve k and the device, bind the objective
        (``objective_``) and make the generators. Returns the checked corpus (a new object:
        ``corpus`` is not changed)."""
        self.check_params()
        objective = resolve_objective(
            self.objective, self.algorithm, self.lamb, default_algorithm=self.default_algorithm
        )
        if objective is self.objective:  # fit leaves the caller's objective as given
            objective = _copy_to_bind(objective)
        corpus = check_corpus(corpus)
        self.device_ = resolve_device(self.device)
        self.budget_ = self._token_budget(corpus)
        if self.budget_ is None:
            self.k_ = resolve_k(self.select_ratio, corpus.n_docs, self.k)
        else:  # the count it is expected to keep; the fit sets the count it kept
            self.k_ = self.budget_.expected_count()
        self.objective_ = objective.bind(
            corpus,
            self.k_,
            self.device_,
            seed=self.seed,
            max_neighbors=self.max_neighbors,
            budget=self.budget_,
        )
        own = seed_streams(self.seed, 1)[0]  # stream 0; the objective's terms have 1, 2, ...
        self._torch_gen, self._np_rng = make_generators(own, self.device_)
        self._cap = (
            None
            if self.max_similarity is None
            else SimilarityCap(self.objective_.features_, self.max_similarity, capacity=self.k_)
        )
        return corpus

    #: Whether the method keeps a token budget (``budget_tokens``): it ranks documents
    #: (its ranking is filled by :meth:`_top_k`) or prices its gains per token.
    takes_tokens: ClassVar[bool] = False

    def _token_budget(self, corpus: Corpus) -> TokenBudget | None:
        """The token budget of the parameters on ``corpus``, or None (a document budget)."""
        budget = resolve_token_budget(
            corpus.lengths, self.budget_tokens, self.select_token_ratio, corpus.source
        )
        if budget is None:
            return None
        if self.k is not None:
            raise ValueError(
                f"give the budget either as k or as a token budget ({TOKEN_FLAGS}), not both; "
                f"got k={self.k}."
            )
        if not self.takes_tokens:
            able = ", ".join(sorted(m for m, c in _token_methods().items()))
            raise ValueError(
                f"method {self.method!r} does not keep a token budget ({TOKEN_FLAGS}); "
                f"methods that do: {able}."
            )
        return budget

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Return (selected rows, per-row scores, higher = kept first). Each selector's own."""
        raise NotImplementedError

    # --- the fitted result -----------------------------------------------------------------
    def selection(self) -> Selection:
        """The fitted result as a :class:`~datamask.data.Selection`."""
        return Selection(
            selected=self.selected_,
            scores=self.scores_,
            meta={"method": self.method, "terms": self.terms_, "seconds": self.fit_seconds_},
        )

    def resolved_params(self) -> dict[str, Any]:
        """What ``fit`` decided by itself (defaults that depend on the data, the cap's
        largest kept similarity), by fitted attribute name: the run's summary records it."""
        if self.max_similarity is None:
            return {}
        return {"max_pair_similarity_": self.max_pair_similarity_}

    def fit_stats(self) -> dict[str, Any]:
        """Counts and timings of the fit, by name without the trailing ``_`` (the bench's
        columns). Selectors add their own."""
        tokens = (
            {}
            if self.budget_ is None
            else {"tokens": self.tokens_, "budget_tokens": self.budget_.total}
        )
        return {
            "k": self.k_,
            **tokens,
            "graph_seconds": self.graph_seconds_,
            "optimise_seconds": self.optimise_seconds_,
        }

    @classmethod
    def comparable_scores(cls, corpus: Corpus, ids: pa.Array, seed: int) -> np.ndarray:
        """Per-document scores that compare across groups (:attr:`modular` methods only)."""
        raise TypeError(f"{cls.__name__} is not modular: its scores depend on its group.")

    # --- the max_similarity cap (no-ops without one) ----------------------------------------
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

    def _top_k(self, scores: np.ndarray, ids: np.ndarray, *, what: str | None = None) -> np.ndarray:
        """The k best scores (ties by id); under the cap, the k best compatible ones. Under
        a token budget: the ranking walked down, keeping each row that fits (and that the
        cap admits)."""
        if self.budget_ is not None:
            cap = None
            if self.max_similarity is not None:
                cap = SimilarityCap(self.objective_.features_, self.max_similarity)
            rows = self.budget_.fill(rank_order(scores, ids), None if cap is None else cap.admit)
            return np.sort(rows)
        if self.max_similarity is None:
            return top_k_rows(scores, ids, self.k_)
        return capped_top_k(
            scores,
            ids,
            self.k_,
            self.objective_.features_,
            self.max_similarity,
            what=what or f"{self.method}'s ranking",
        )

    def _bar(self, total: int, *, desc: str | None = None, unit: str = "pick") -> tqdm:
        return tqdm(
            total=total,
            disable=not self.progress,
            desc=desc or self.method or "select",
            unit=unit,
            dynamic_ncols=True,
        )


def _token_methods() -> dict[str, type]:
    """The defined selectors that keep a token budget, by method name (for the error that
    names them): the subclasses of :class:`Selector`, so no registry is imported here."""
    out: dict[str, type] = {}
    todo = list(Selector.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.method and cls.takes_tokens:
            out[cls.method] = cls
    return out
