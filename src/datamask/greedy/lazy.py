"""Lazy greedy (Minoux's accelerated greedy) with batched re-evaluation of stale gains.

The benchmark's yardstick: on the sparse K-nearest-neighbour graph of facility location
(``greedy``, the greedy a user of apricot or faiss would run) or on all pairs
(``greedy-dense``, O(n^2) memory). Either returns exactly the naive greedy selection of its
objective, in the same order, for a fraction of the gain evaluations.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from .._validation import Interval
from ..base import Selector
from ..budget import TokenBudget
from ..data import Corpus
from ..near_duplicates import SimilarityCap
from ..objectives import Objective
from ..objectives.base import HostGains
from ._trace import GreedyTrace, pick_order_scores
from .budgeted import full_budget_picks

__all__ = [
    "DenseGreedy",
    "LazyGreedy",
    "gain_order",
    "is_submodular",
    "lazy_picks",
]


def is_submodular(objective: Objective) -> bool:
    """Whether every term of ``objective`` declares ``submodular = True`` (stale gains are
    bounds). A new term gets lazy evaluation by declaring it.

    Quality and facility location do. Pairwise similarity is submodular only when no two
    documents have a negative cosine, and DiSF is not submodular at all: both do not.
    """
    return all(term.submodular for _, term in objective.terms)


def lazy_picks(
    objective: Objective,
    state: list,
    bounds: torch.Tensor,
    k: int,
    *,
    batch_size: int = 4,
    lazy: bool = True,
    refuse: Callable[[int], bool] | None = None,
    before_check: Callable[[int], None] | None = None,
    counter: Any = None,
) -> Iterator[tuple[int, float]]:
    """Yield ``k`` greedy picks ``(row, exact gain)`` of a bound objective, lazily.

    ``bounds`` holds the exact gains of every row for the empty selection, ``-inf`` for
    rows that may not be picked; it is updated in place. For a submodular objective
    (``lazy``) a stale gain bounds the true one, so only the best stale rows are
    re-evaluated, ``batch_size`` of them at a time (doubling while stale rows lead);
    otherwise every remaining row is re-evaluated at every pick. ``refuse(row)`` drops a
    row from the pool instead of picking it (the similarity cap); ``before_check(t)`` runs
    before each argmax; ``counter.n_evaluations_`` counts the gains computed.
    """
    n = len(bounds)
    device = bounds.device
    # fresh[i] == t: bounds[i] is the exact gain of row i for the selection at pick t.
    fresh = torch.zeros(n, dtype=torch.long, device=device)
    taken = torch.isneginf(bounds)
    for t in range(k):
        if t > 0 and not lazy:  # no bounds: re-evaluate every remaining row
            rest = torch.nonzero(~taken).squeeze(1)
            bounds[rest] = objective.gains(state, rest)
            fresh[rest] = t
            if counter is not None:
                counter.n_evaluations_ += len(rest)
        m = min(batch_size, n)
        while True:
            if before_check is not None:
                before_check(t)
            # torch.argmax returns the first maximum: ties go to the lower index.
            j = int(torch.argmax(bounds))  # sync point: once per check
            if int(fresh[j]) == t:
                if refuse is None or not refuse(j):
                    break
                taken[j], bounds[j] = True, -torch.inf  # conflicts with a kept row
                continue
            # Re-evaluate the best stale rows together (taken rows hold -inf).
            top = torch.topk(bounds, min(m, n)).indices
            stale = top[(fresh[top] != t) & ~taken[top]]
            if len(stale) == 0:  # j tied with m fresh rows topk preferred
                stale = torch.tensor([j], device=device)
            bounds[stale] = objective.gains(state, stale)
            fresh[stale] = t
            if counter is not None:
                counter.n_evaluations_ += len(stale)
            m = min(2 * m, n)  # many stale leaders: widen the next pass
        gain = float(bounds[j])
        state = objective.update(state, j)
        taken[j] = True
        bounds[j] = -torch.inf
        yield j, gain


class _Pool:
    """A bound objective seen through a subset of its rows: candidate ``i`` is row
    ``rows[i]`` (every row still counts for coverage), so the greedy's argmax and top-k
    scan the pool, not the corpus."""

    def __init__(self, objective: Objective, rows: torch.Tensor) -> None:
        self.objective, self.rows = objective, rows

    def gains(self, state: list, candidates: torch.Tensor) -> torch.Tensor:
        return self.objective.gains(state, self.rows[candidates])

    def update(self, state: list, j: int) -> list:
        return self.objective.update(state, int(self.rows[j]))


def gain_order(
    objective: Objective,
    rows: np.ndarray,
    *,
    batch_size: int = 16,
    k: int | None = None,
    sizes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Order ``rows`` greedily on a bound objective and return ``(order, gains)``.

    Lazy greedy restricted to ``rows`` (every other document still counts for coverage),
    on the objective's graph when it has one, run until every row is picked: ``order`` is
    ``rows`` in pick order and ``gains[t]`` the exact marginal gain of the t-th pick, in
    the objective's units. For a submodular objective the gains do not increase, so any
    prefix of ``order`` is the greedy selection of its size from ``rows``: the gain curve a
    sharded run allocates its budget with. Ties go to the lower row.

    When every term has host gains (:meth:`~datamask.objectives.base.Term.host_gains`:
    quality and facility location do) and the objective is submodular, the picks run on
    the host, one heap pop and a few numpy ops each (:func:`host_picks`); else on
    the objective's tensors (:func:`lazy_picks`, ``batch_size`` stale rows at a time).
    ``k`` stops after that many picks (the greedy selection of size ``k``; default: all).

    ``sizes`` (each row's length, a token budget): the cost-benefit order instead, by gain
    per token (:func:`budget_picks`' rule with every row fitting), on host gains; the gains
    returned are still the plain marginal gains. Their ratios to ``sizes`` do not increase
    (a submodular objective): the per-token curve a sharded token run allocates with.
    """
    pool = np.sort(np.asarray(rows, dtype=np.int64))  # ascending: ties to the lower row
    if not len(pool):  # a group that keeps nothing has an empty curve
        return pool, np.zeros(0, dtype=np.float64)
    objective.build_graphs()
    m = len(pool) if k is None else min(k, len(pool))
    hosts = host_gains_of(objective)
    if sizes is not None:
        if hosts is None:
            raise ValueError(
                "a token budget needs a submodular objective whose terms have host gains "
                "(quality and facility location: --algorithm Facility)."
            )
        picks = list(_ratio_picks(hosts, pool, np.asarray(sizes, dtype=np.float64), m))
    elif hosts is not None:
        picks = list(host_picks(hosts, pool, m))
    else:
        rows_t = torch.as_tensor(pool, device=objective.device_)
        state = objective.init_state(graph=True)
        bounds = objective.gains(state, rows_t).clone()  # exact gains, empty selection
        lazy = is_submodular(objective)
        picks = list(
            lazy_picks(_Pool(objective, rows_t), state, bounds, m, batch_size=batch_size, lazy=lazy)
        )
    order = np.asarray([j for j, _ in picks], dtype=np.int64)
    if hosts is None and sizes is None:  # the tensor picks are positions in the pool
        order = pool[order]
    gains = np.asarray([g for _, g in picks], dtype=np.float64)
    return order, gains


def _ratio_picks(
    hosts: list[tuple[float, HostGains]], rows: np.ndarray, sizes: np.ndarray, k: int
) -> Iterator[tuple[int, float]]:
    """``k`` cost-benefit picks ``(row, exact gain)`` among ``rows``: lazily by gain per
    token (``sizes[row]``), a heap of stale ratios ``(-gain / size, row)`` (ties: the lower
    row); :func:`budget_picks` with a budget every row fits in."""

    def entry(j: int, t: int) -> tuple[float, int, int, float]:
        gain = host_gain(hosts, j)
        return -gain / sizes[j], j, t, gain

    heap = [entry(j, 0) for j in rows.tolist()]
    heapq.heapify(heap)
    for t in range(k):
        while True:
            _, j, fresh, gain = heapq.heappop(heap)
            if fresh == t:
                break
            heapq.heappush(heap, entry(j, t))
        for _, h in hosts:
            h.update(j)
        yield j, gain


def host_gains_of(objective: Objective) -> list[tuple[float, HostGains]] | None:
    """Every term's host gains with its weight, for a submodular objective whose every
    term has them (:meth:`~datamask.objectives.base.Term.host_gains`); else None."""
    if not is_submodular(objective):
        return None
    hosts = [(w, term.host_gains()) for w, term in objective.terms]
    return hosts if all(h is not None for _, h in hosts) else None  # type: ignore[return-value]


def host_gain(hosts: list[tuple[float, HostGains]], j: int) -> float:
    """The objective's gain of row ``j`` from its terms' host gains, rounded to float32 as
    the tensor greedy's gains are: the similarities' last bit can differ with the thread
    count (a pool's worker against one process), and a float64 sum would carry it into
    the gains a run writes."""
    return float(np.float32(sum(w * h.gain(j) for w, h in hosts)))


def host_picks(
    hosts: list[tuple[float, HostGains]],
    rows: np.ndarray,
    k: int,
    *,
    bounds: Any = None,
    refuse: Callable[[int], bool] | None = None,
    before_check: Callable[[int], None] | None = None,
    counter: Any = None,
) -> Iterator[tuple[int, float]]:
    """:func:`lazy_picks` on host gains: ``k`` greedy picks ``(row, exact gain)`` among
    ``rows``, by Minoux's lazy greedy with a heap of stale bounds ``(-gain, row)``, so the
    top is the largest bound and, among equal ones, the lower row. A top whose bound was
    computed for the current selection is the pick (unless ``refuse(row)`` drops it);
    else its gain is computed again and pushed back (a stale gain bounds the fresh one).
    ``bounds``: each row's gain for the empty selection (:func:`host_gain`; computed here
    when not given). ``before_check(t)`` runs before each look at the top;
    ``counter.n_evaluations_`` counts the gains computed after the first ones.

    A pick costs a heap pop and a few numpy ops, no tensor op: on CUDA a tensor op per pick
    is a kernel launch and often a sync, which dominated a sharded group's time
    (benchmarks/gpu/RESULTS.md); on the CPU this is 1.2-1.4x faster
    (benchmarks/realtext/RESULTS.md, host gains)."""

    if bounds is None:
        bounds = [host_gain(hosts, int(j)) for j in rows]
    # (-bound, row, the pick it was fresh at); a row with bound -inf may not be picked
    heap = [(-b, int(j), 0) for j, b in zip(rows, bounds, strict=True) if b != -np.inf]
    heapq.heapify(heap)
    for t in range(k):
        while True:
            if before_check is not None:
                before_check(t)
            neg, j, fresh = heapq.heappop(heap)
            if fresh == t:
                if refuse is None or not refuse(j):
                    break
                continue  # conflicts with a kept row: out of the pool
            heapq.heappush(heap, (-host_gain(hosts, j), j, t))
            if counter is not None:
                counter.n_evaluations_ += 1
        for _, h in hosts:
            h.update(j)
        yield j, -neg


class _SummedGains(HostGains):
    """The objective's gains as one :class:`HostGains`: its terms' host gains, weighted
    (:func:`host_gain`), or, with ``hosts`` None, its tensor gains on ``state`` (one
    candidate at a time: dense facility location, ``greedy-dense``)."""

    def __init__(self, objective: Objective, graph: bool) -> None:
        self.hosts = host_gains_of(objective) if graph else None
        self.objective = objective
        self.state = None if graph else objective.init_state(graph=False)

    def gain(self, j: int) -> float:
        if self.hosts is not None:
            return host_gain(self.hosts, j)
        row = torch.tensor([j], device=self.objective.device_)
        return float(self.objective.gains(self.state, row)[0])

    def update(self, j: int) -> None:
        if self.hosts is None:
            self.state = self.objective.update(self.state, j)
            return
        for _, h in self.hosts:
            h.update(j)


def budget_picks(
    gains: HostGains,
    bounds: np.ndarray,
    budget: TokenBudget,
    *,
    per_token: bool,
    refuse: Callable[[int], bool] | None = None,
) -> Iterator[tuple[int, float]]:
    """Greedy picks ``(row, exact gain)`` under a token ``budget``, lazily as
    :func:`host_picks`: by gain per token (``per_token``, the cost-benefit greedy) or by
    gain, among the rows that still fit. A row that no longer fits is dropped for good
    (the tokens left only shrink); the picks end when no row fits. ``bounds``: each row's
    gain for the empty selection."""
    sizes = budget.sizes
    cost = sizes if per_token else np.ones_like(sizes)
    keys = bounds / cost
    heap = [(-float(b), j, 0) for j, b in enumerate(keys.tolist())]
    heapq.heapify(heap)
    left, smallest, t = budget.total, float(sizes.min()), 0
    while heap and left >= smallest:
        neg, j, fresh = heapq.heappop(heap)
        if sizes[j] > left:
            continue  # never fits again
        if fresh != t:
            heapq.heappush(heap, (-gains.gain(j) / cost[j], j, t))
            continue
        if refuse is not None and refuse(j):
            continue
        gains.update(j)
        left -= sizes[j]
        t += 1
        yield j, -neg * cost[j]


class LazyGreedy(Selector):
    """Lazy greedy maximisation of the objective, exactly equal to naive greedy.

    Facility location is counted on its K-nearest-neighbour graph (the learner's graph,
    same K): the greedy maximises the graph objective exactly, and the selection is then
    scored with the exact objective like every selector's. Pair_simi and DiSF need no
    graph. :class:`DenseGreedy` counts facility location on all pairs.

    1. All initial gains are computed in one vectorised call of ``objective.gains``.
    2. Every pick: the row with the highest stored gain is taken if that gain was computed
       for the current selection; otherwise the ``batch_size`` best stale rows are
       re-evaluated in one tensor op and the check repeats. For a submodular objective a
       stale gain is an upper bound on the true one, so the row taken is the true argmax
       (ties: the lower row index, as in naive greedy).

    When a term does not declare ``submodular`` (pairwise similarity, DiSF), stale gains
    are not bounds; every pick then re-evaluates all remaining rows (``lazy_ = False``),
    which is still exact greedy.

    Parameters
    ----------
    graph : bool, default=True
        Facility-location gains on the K-NN graph (False: on all pairs, O(n^2)).
    batch_size : int, default=4
        Stale rows re-evaluated together. One evaluation streams the whole corpus, so a
        few extra candidates per pass are nearly free while a second pass is not.
    **kwargs
        ``objective, algorithm, lamb, select_ratio, k, seed, device, progress`` as in
        :class:`~datamask.base.Selector`.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the picked documents.
    order_ : ndarray of int64, shape (k,)
        The same rows in pick order.
    scores_ : ndarray of float64, shape (n_docs,)
        ``-t`` for the t-th pick, ``-n_docs`` for rows never picked.
    terms_ : dict
        Exact objective terms of the selection.
    history_ : list of dict
        Running objective (J of the picks so far) every ~k/50 picks, with its time.
    n_evaluations_ : int
        Marginal gains computed, the initial n included.
    initial_seconds_ : float
        Time spent on the initial gains (the graph build excluded).
    graph_seconds_ : float
        Time spent building the neighbour graph (0 for ``greedy-dense``).
    lazy_ : bool
        Whether stale gains were used as bounds (see above).
    fit_seconds_ : float
        Wall time of :meth:`fit`.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import LazyGreedy
    >>> corpus = make_clustered(500, 16, 5, seed=0)
    >>> sel = LazyGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    >>> len(sel.selected_), sel.n_evaluations_ < 500 * 50
    (50, True)
    """

    method = "greedy"
    takes_tokens = True
    _parameter_constraints = {
        "graph": [bool],
        "batch_size": [Interval(int, 0, None, closed="neither")],
    }

    def __init__(
        self,
        objective: Objective | None = None,
        *,
        graph: bool = True,
        batch_size: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(objective, **kwargs)
        self.graph = graph
        self.batch_size = batch_size

    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        if self.budget_ is not None:
            return self._select_tokens(corpus, objective)
        n, k = corpus.n_docs, self.k_
        self.lazy_ = is_submodular(objective)
        state = objective.init_state(graph=self.graph)
        if self.graph:
            objective.build_graphs()
        self._trace = trace = GreedyTrace(k, self._start)
        # On the graph, when every term has host gains: the picks on the host (host_picks,
        # the same picks as the tensor loop, 1.2-1.4x faster on the CPU and with no launch
        # or sync a pick on CUDA); else on the objective's tensors (lazy_picks).
        hosts = host_gains_of(objective) if self.graph else None
        # 1. Exact gains of every row for the empty selection: one vectorised call on the
        #    tensors, or a host gain a row. In ~50 slices under a bar: at N=200k without a
        #    cached dense matrix this pass alone takes minutes.
        t0 = time.perf_counter()
        rows = torch.arange(n, device=self.device_)
        parts: list[Any] = []
        with self._bar(n, desc=f"{self.method} initial gains", unit="doc") as bar:
            for part in rows.split(max(1, -(-n // 50))):
                if hosts is None:
                    parts.append(objective.gains(state, part))
                else:
                    parts.append([host_gain(hosts, j) for j in part.tolist()])
                bar.update(len(part))
        self.initial_seconds_ = time.perf_counter() - t0
        self.n_evaluations_ = n
        hooks = {
            "refuse": self._capped,
            "before_check": lambda t: self._check_left(t, n),
            "counter": self,
        }
        if hosts is None:
            picks = lazy_picks(
                objective,
                state,
                torch.cat(parts),
                k,
                batch_size=self.batch_size,
                lazy=self.lazy_,
                **hooks,
            )
        else:
            bounds = [b for part in parts for b in part]
            picks = host_picks(hosts, np.arange(n), k, bounds=bounds, **hooks)
        with self._bar(k) as bar:
            for j, gain in picks:
                trace.add(j, gain)
                bar.update()
        self.order_ = np.asarray(trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, n)

    def _select_tokens(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Under a token budget: the cost-benefit lazy greedy (gain per token) and the
        plain-gain one, each until no row fits, and the better of the two on the graph
        objective: with the plain run as the guard, the pair keeps a constant-factor
        guarantee, (1 - 1/e) / 2, that the cost-benefit run alone lacks (Leskovec et al.,
        KDD 2007, "Cost-effective outbreak detection"). ``per_token_`` says which won.

        Where stale gains are not bounds (Pair_simi, DiSF), or without host gains on the
        graph, the pair runs without laziness (:func:`full_budget_picks`, ``lazy_`` False)."""
        if self.graph:
            objective.build_graphs()
        self.lazy_ = is_submodular(objective) and (
            not self.graph or host_gains_of(objective) is not None
        )
        self.n_evaluations_, self.initial_seconds_ = 0, 0.0
        bounds = self._initial_bounds(corpus, objective) if self.lazy_ else None
        runs = []
        for per_token in (True, False):
            if self.max_similarity is not None:
                self._cap = SimilarityCap(objective.features_, self.max_similarity)
            trace = GreedyTrace(self.k_, self._start)
            if self.lazy_:
                gains = _SummedGains(objective, self.graph)  # fresh: each run starts empty
                picks = budget_picks(
                    gains, bounds, self.budget_, per_token=per_token, refuse=self._capped
                )
            else:
                picks = full_budget_picks(
                    objective,
                    objective.init_state(graph=self.graph),
                    self.budget_,
                    per_token=per_token,
                    refuse=self._capped,
                    counter=self,
                )
            with self._bar(self.k_, desc=f"{self.method} per token" if per_token else None) as bar:
                for j, gain in picks:
                    trace.add(j, gain)
                    bar.update()
            rows = torch.as_tensor(trace.order, dtype=torch.long, device=self.device_)
            value = sum(  # each on the objective it maximised: the graph's, or all pairs
                w * (term.graph_value(rows) if self.graph else term.value(rows))
                for w, term in objective.terms
            )
            runs.append((value, per_token, trace))
        _, self.per_token_, self._trace = max(runs, key=lambda r: (r[0], r[1]))
        self.order_ = np.asarray(self._trace.order, dtype=np.int64)
        return self.order_, pick_order_scores(self.order_, corpus.n_docs)

    def _initial_bounds(self, corpus: Corpus, objective: Objective) -> np.ndarray:
        """Every row's gain for the empty selection (float64): its host gains on the graph,
        or one tensor call on all pairs. Sets ``initial_seconds_`` and counts the gains."""
        t0 = time.perf_counter()
        if self.graph:  # the host gains, as the picks re-evaluate them
            first = _SummedGains(objective, graph=True)
            bounds = np.asarray([first.gain(j) for j in range(corpus.n_docs)])
        else:  # dense: every row's gain in one tensor call
            every = torch.arange(corpus.n_docs, device=self.device_)
            state = objective.init_state(graph=False)
            bounds = objective.gains(state, every).double().cpu().numpy()
        self.initial_seconds_ = time.perf_counter() - t0
        self.n_evaluations_ = corpus.n_docs
        return bounds

    def fit_stats(self) -> dict[str, Any]:
        """The base's, with the gains computed, the initial pass's time and ``lazy_``."""
        own = {
            "n_evaluations": self.n_evaluations_,
            "initial_seconds": self.initial_seconds_,
            "lazy": self.lazy_,
        }
        return {**super().fit_stats(), **own}


class DenseGreedy(LazyGreedy):
    """:class:`LazyGreedy` with facility location counted on all pairs (``greedy-dense``).

    Exact greedy on the full objective; the n x n similarity matrix is held while it fits
    ``FacilityLocation.dense_max_bytes`` (N=50k: 10 GB), else rebuilt row by row per gain.

    Examples
    --------
    >>> from datamask import make_clustered
    >>> from datamask.greedy import DenseGreedy
    >>> sel = DenseGreedy(select_ratio=0.1, device="cpu").fit(make_clustered(300, 8, 4))
    >>> len(sel.selected_), sel.graph_seconds_
    (30, 0.0)
    """

    method = "greedy-dense"
    _parameter_constraints = {  # always on all pairs: no graph parameter
        k: v for k, v in LazyGreedy._parameter_constraints.items() if k != "graph"
    }

    def __init__(self, objective: Objective | None = None, *, batch_size: int = 4, **kwargs):
        super().__init__(objective, graph=False, batch_size=batch_size, **kwargs)
