"""DATAMASK: select a subset by learning one keep-logit per document with policy gradients.

Run it on the demo data::

    datamask select --input examples/demo/demo_docs.parquet --output out/selection.parquet

The loop follows ``shared/METHOD.md`` step by step (sample -> score -> advantage -> update)
in :meth:`MaskLearner._reinforce_step`. Two deviations from the reference are options, and
the default estimator is the second one:

- ``estimator="reinforce"`` is the reference: Bernoulli (or exact-k Gumbel top-k) masks
  over a random ``partial`` batch, ``n_rollout`` rewards normalised within the group
  (or against a leave-one-out baseline), gradient ``(m - p)``.
- ``estimator="expected"`` computes the same policy gradient, ``d E_{m~p}[J(m)] / d theta``,
  exactly instead of by sampling: E[J] has a closed form for every term (modular quality,
  quadratic pairwise similarity, facility location over a K-nearest-neighbour graph; DiSF
  uses a mean-field relaxation), so the gradient has no sampling variance. The keep-
  probabilities are ``sigmoid(theta - tau)`` with ``tau`` set each step so that they sum
  to k: the policy keeps k documents in expectation, which is the budget of the final
  top-k. Steps use the gradient scaled to unit RMS, so ``lr`` is in logit units.
  Measured in ``benchmarks/estimators`` (docs/method.md "Estimators, measured"): it
  reaches the greedy objective where the reference estimator stalls far below.

The k highest final logits are then improved by a swap local search on the exact graph
objective (``refine="swap"``, :mod:`datamask.optim.local_search`), which never lowers it:
on real text it is what puts the learner above the sparse greedy (docs/method.md "The
learner's variants, measured on real text").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from .._memory import heap_for_repeats
from .._validation import DEFAULT_SELECT_RATIO, Interval, Options
from ..base import Selector
from ..data import Corpus, Selection, rank_order, top_k_rows
from ..objectives import Objective
from ..objectives.facility_location import LEARNER_MAX_NEIGHBORS
from .local_search import swap_search

__all__ = ["MaskLearner", "ESTIMATORS", "INITS", "top_k_rows"]

ESTIMATORS = ("expected", "reinforce")
#: Default steps of the expected estimator: ``min(EXPECTED_STEPS, max(MIN_EXPECTED_STEPS,
#: ceil(k / 4)))`` (see ``n_epochs``).
EXPECTED_STEPS = 100
MIN_EXPECTED_STEPS = 10
REFINES = ("swap", "none")
INITS = ("same", "quality")
MASK_SAMPLERS = ("bernoulli", "topk")
#: Newton steps of the budget shift per learner step (:func:`_budget_newton`).
NEWTON_STEPS = 3
BASELINES = ("group", "loo")
#: One learner step: ``(theta, lr, n) -> the objective it logs`` (theta updated in place).
StepFn = Callable[[torch.Tensor, float, int], torch.Tensor]


def _kept(p: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
    """``sum(p)`` in float64, or ``sum(p * sizes)`` under a token budget."""
    return p.sum(dtype=torch.float64) if sizes is None else (p.double() * sizes).sum()


def _budget_shift(
    theta: torch.Tensor,
    k: float,
    start: torch.Tensor | None = None,
    tol: float = 1e-3,
    sizes: torch.Tensor | None = None,
) -> torch.Tensor:
    """``tau`` with ``sum(sigmoid(theta - tau)) == k`` (to ``tol``), no gradient; with
    ``sizes`` (a token budget, lengths over their mean), ``sum(sizes * sigmoid(...)) == k``.

    Newton's method from ``start`` (a few iterations suffice), falling back to bisection
    when Newton fails to converge in 8 iterations. Reads the residual on the host at every
    iteration: the learner calls it only before and after its steps
    (:func:`_budget_newton` in between).
    """
    tau = theta.new_tensor(0.0, dtype=torch.float64) if start is None else start
    for _ in range(8):
        p = torch.sigmoid(theta - tau)
        excess = _kept(p, sizes) - k
        slope = _kept(p * (1 - p), sizes)
        if abs(float(excess)) < tol:  # sync point: once per Newton iteration
            return tau
        tau = tau + excess / slope.clamp_min(1e-6)
    lo, hi = theta.min().double() - 40.0, theta.max().double() + 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        too_many = _kept(torch.sigmoid(theta - mid), sizes) > k
        lo = torch.where(too_many, mid, lo)
        hi = torch.where(too_many, hi, mid)
    return (lo + hi) / 2


def _budget_newton(
    theta: torch.Tensor,
    k: float,
    tau: torch.Tensor,
    reach: torch.Tensor,
    sizes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``NEWTON_STEPS`` Newton steps on ``sum(sigmoid(theta - tau)) = k`` from the last
    step's ``tau``, each kept within ``reach`` of it; returns the new ``tau`` and
    ``sigmoid(theta - tau)``. A fixed number of tensor ops and no host read (no sync).

    ``reach`` is the largest logit move of the last step: no logit moved further, so
    neither did the root, and the clamp keeps a step through a flat stretch (every
    probability near 0 or 1) from overshooting, which is why :func:`_budget_shift`
    needed a bisection fallback. The sums are in float64: in float32 the sum of 1M
    probabilities carries more rounding than the tolerance. Three steps leave
    ``|sum(p) - k|`` below 2.2e-3 documents at every step of a 30k-row fit (median 4e-4;
    two steps: up to 2.6), the tolerance :func:`_budget_shift` stopped at
    (``tests/optim/test_mask_learner.py`` checks it). ``sizes``: as in :func:`_budget_shift`.
    """
    lo, hi = tau - reach, tau + reach
    p = torch.sigmoid(theta - tau)
    for _ in range(NEWTON_STEPS):
        excess = _kept(p, sizes) - k
        slope = _kept(torch.addcmul(p, p, p, value=-1.0), sizes)  # p (1 - p)
        tau = torch.clamp(tau + excess / slope.clamp_min(1e-6), lo, hi)
        p = torch.sigmoid(theta - tau)
    return tau, p


class MaskLearner(Selector):
    """Policy-gradient mask learning over per-document keep-logits (DATAMASK).

    Parameters
    ----------
    objective : Objective, optional
        What to maximise. Default: ``Objective(make_term(algorithm), lamb=lamb)``.
    algorithm : str, optional
        Diversity term, a registered name (the reference's ``Facility``, ``Pair_simi``,
        ``DiSF``, or a user term), when ``objective`` is not given. Default ``Facility``.
    lamb : float, optional
        Quality weight when ``objective`` is not given. Default 0.5. Giving ``algorithm``
        or ``lamb`` with ``objective`` is an error (they would be ignored).
    select_ratio : float, default=0.3
        Fraction of documents kept, in (0, 1); exactly ``round(select_ratio * n)`` are.
    k : int, optional
        Keep exactly this many documents instead (1 <= k <= n); used by the sharded
        runner to honour a global ratio exactly. The learner still uses ``select_ratio``
        for its initial logits and Gumbel top-k batch sizes.
    budget_tokens, select_token_ratio : float, optional
        A token budget instead (:class:`~datamask.base.Selector`): the probabilities keep
        T tokens in expectation, steps follow the gain per token, the rounding walks the
        logits down keeping each row that fits, and the swaps stay within the budget.
    n_epochs : int, optional
        Optimisation steps. Default 5000 for reinforce (the reference); for expected
        ``min(100, max(10, ceil(k / 4)))``: below 400 kept documents the swap rounding
        reaches the same J from fewer steps (benchmarks/realtext/RESULTS.md, speed), and a
        learner that takes as many steps as the greedy takes picks is slower than it.
    partial : float, default=0.1
        Fraction of documents drawn per step: the batch of the reinforce estimator; for
        the expected estimator, the documents whose coverage is averaged (facility
        location only; the other terms are exact over all documents).
    n_rollout : int, default=128
        Masks sampled per step (reinforce only).
    max_lr, min_lr : float, optional
        The learning rate falls linearly from ``max_lr`` to ``min_lr``. Defaults 10 -> 1 for
        reinforce (the reference), 0.5 -> 0.02 for expected (logit units per step).
    init : {"same", "quality"}, default="quality"
        Equal logits (``p = select_ratio``) or logits from the quality ranking.
    estimator : {"expected", "reinforce"}, default="expected"
        See the module docstring.
    mask_sampler : {"bernoulli", "topk"}, default="bernoulli"
        Reinforce masks: independent Bernoulli (reference) or exact-k Gumbel top-k.
    baseline : {"group", "loo"}, default="group"
        Reinforce advantage: group-normalised (reference) or leave-one-out.
    seed : int, default=0
        Seeds every random draw; the same seed gives the same selection on the same device.
    device : str, default="auto"
        "auto", "cpu", "cuda" or "cuda:N".
    progress : bool, default=False
        Show a progress bar with the running objective.
    log_every : int, default=0
        Record ``history_`` (and refresh the bar) every this many steps; 0 picks ~50 points.
    refine : {"swap", "none"}, default="swap"
        Rounding of the logits: ``none`` keeps their top k; ``swap`` improves that top k
        by swap local search on the graph objective (:func:`~datamask.optim.local_search.
        swap_search`), which never lowers it. docs/method.md "The learner and its estimator".
    max_swap_rounds : int, default=200
        Rounds of the swap search.
    max_similarity : float, optional
        Hard cap: no two kept documents have cosine similarity above it (default: no cap).
        Applied after the rounding: walking down the ranking (the refined selection first,
        then the logits), a document that conflicts with a higher-ranked kept one is skipped
        and the next compatible one kept instead.

    Attributes
    ----------
    selected_ : ndarray of int64, shape (k,)
        Sorted row indices of the kept documents.
    logits_ : ndarray of float32, shape (n_docs,)
        Final logits theta.
    scores_ : ndarray of float64, shape (n_docs,)
        The logits, the selected rows lifted above all others (higher = kept first; equal
        to the logits when the refinement swapped nothing).
    probabilities_ : ndarray of float32, shape (n_docs,)
        Final keep-probabilities.
    history_ : list of dict
        Per logged step: step, lr, the running objective and its time.
    terms_ : dict
        Exact objective terms of the selection.
    fit_seconds_ : float
        Wall time of :meth:`fit` up to the selection, without the exact evaluation of
        ``terms_`` afterwards (every selector is timed the same way).
    graph_seconds_, optimise_seconds_ : float
        ``fit_seconds_`` split into building the neighbour graph and the rest.
    evaluate_seconds_ : float
        Time of the exact evaluation of ``terms_`` after the selection (0 without it).
    learn_seconds_ : float
        Time of the ``n_epochs_`` steps (inside ``optimise_seconds_``, without the
        neighbour graph a first step builds; on CUDA up to the one read of the logged
        objective after the loop, which waits for the last step):
        ``learn_seconds_ / n_epochs_`` is the time of one step.
    refine_seconds_ : float
        Time of the swap search (inside ``optimise_seconds_``).
    swaps_ : int
        Swaps the refinement made.

    Examples
    --------
    >>> from datamask import MaskLearner, make_clustered
    >>> corpus = make_clustered(600, 16, 6, seed=0)
    >>> learner = MaskLearner(select_ratio=0.1, n_epochs=50, seed=0, device="cpu").fit(corpus)
    >>> len(learner.selected_)
    60
    """

    method = "mask"
    max_neighbors = LEARNER_MAX_NEIGHBORS
    takes_tokens = True
    #: The method's own parameters and what each accepts (the CLI's flags are made from it).
    _parameter_constraints: ClassVar[dict[str, list]] = {
        "n_epochs": [Interval(int, 0, None, closed="neither"), None],
        "partial": [Interval(float, 0, 1, closed="right")],
        "n_rollout": [Interval(int, 0, None, closed="neither")],
        "max_lr": [Interval(float, 0, None, closed="neither"), None],
        "min_lr": [Interval(float, 0, None, closed="neither"), None],
        "init": [Options(str, INITS)],
        "estimator": [Options(str, ESTIMATORS)],
        "mask_sampler": [Options(str, MASK_SAMPLERS)],
        "baseline": [Options(str, BASELINES)],
        "log_every": [Interval(int, 0, None, closed="left")],
        "refine": [Options(str, REFINES)],
        "max_swap_rounds": [Interval(int, 0, None, closed="neither")],
    }

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
        n_epochs: int | None = None,
        partial: float = 0.1,
        n_rollout: int = 128,
        max_lr: float | None = None,
        min_lr: float | None = None,
        init: str = "quality",
        estimator: str = "expected",
        mask_sampler: str = "bernoulli",
        baseline: str = "group",
        seed: int = 0,
        device: str = "auto",
        progress: bool = False,
        log_every: int = 0,
        refine: str = "swap",
        max_swap_rounds: int = 200,
        max_similarity: float | None = None,
    ) -> None:
        super().__init__(
            objective,
            algorithm=algorithm,
            lamb=lamb,
            select_ratio=select_ratio,
            k=k,
            budget_tokens=budget_tokens,
            select_token_ratio=select_token_ratio,
            seed=seed,
            device=device,
            progress=progress,
            max_similarity=max_similarity,
        )
        self.n_epochs = n_epochs
        self.partial = partial
        self.n_rollout = n_rollout
        self.max_lr = max_lr
        self.min_lr = min_lr
        self.init = init
        self.estimator = estimator
        self.mask_sampler = mask_sampler
        self.baseline = baseline
        self.log_every = log_every
        self.refine = refine
        self.max_swap_rounds = max_swap_rounds

    # ----------------------------------------------------------------------------------------
    def _check_param_rules(self) -> None:
        """The rules between parameters (checks only: nothing is set)."""
        if self.estimator == "reinforce" and self.n_rollout < 2:
            raise ValueError(f"n_rollout must be >= 2 to normalise rewards; got {self.n_rollout}.")
        _, max_lr, min_lr = self._schedule()
        if min_lr > max_lr:
            raise ValueError(f"min_lr ({min_lr}) must not exceed max_lr ({max_lr}).")

    def _schedule(self) -> tuple[int, float, float]:
        """``(n_epochs, max_lr, min_lr)`` with the defaults that depend on the estimator
        (``expected`` without ``n_epochs``: fit sets the steps from k instead)."""
        reinforce = self.estimator == "reinforce"
        n_epochs = self.n_epochs if self.n_epochs is not None else (5000 if reinforce else 100)
        max_lr = self.max_lr if self.max_lr is not None else (10.0 if reinforce else 0.5)
        min_lr = self.min_lr if self.min_lr is not None else (1.0 if reinforce else 0.02)
        return n_epochs, max_lr, min_lr

    def _lr(self, step: int) -> float:
        frac = step / max(self.n_epochs_ - 1, 1)
        return self.max_lr_ + (self.min_lr_ - self.max_lr_) * frac

    def _init_logits(self, quality: torch.Tensor) -> torch.Tensor:
        ratio = self.select_ratio  # the share kept: of the documents, or of the tokens
        if self.budget_ is not None:
            ratio = self.budget_.total / float(self.budget_.sizes.sum())
        base = math.log(ratio / (1.0 - ratio))
        theta = torch.full_like(quality, base)
        if self.init == "quality":
            # Logits from the quality ranking: rank mapped to a standard-normal-like spread.
            ranks = torch.argsort(torch.argsort(quality)).to(quality.dtype)
            z = (ranks + 0.5) / len(quality)
            theta = theta + torch.log(z / (1.0 - z))  # logistic quantiles of the rank
        return theta

    # ----------------------------------------------------------------------------------------
    def _select(self, corpus: Corpus, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
        """Learn the logits on ``corpus``, round their top k. Returns (rows, scores)."""
        self.n_epochs_, self.max_lr_, self.min_lr_ = self._schedule()
        if self.n_epochs is None and self.estimator == "expected":
            self.n_epochs_ = min(EXPECTED_STEPS, max(MIN_EXPECTED_STEPS, math.ceil(self.k_ / 4)))
        theta = self._init_logits(self.objective_.quality_)
        n = corpus.n_docs
        # The budget in expectation: k documents, or T tokens as lengths over their mean
        # (so tolerances and steps stay in documents).
        self._sizes, self._target = None, float(self.k_)
        if self.budget_ is not None:
            mean = float(self.budget_.sizes.mean())
            self._sizes = torch.as_tensor(self.budget_.sizes / mean, device=self.device_)
            self._target = self.budget_.total / mean
        if self.estimator == "expected":
            step_fn = self._expected_step
            self._tau = _budget_shift(theta, self._target, sizes=self._sizes)  # once, exact
            self._reach = theta.new_zeros(())  # the largest logit move of the last step
        else:
            step_fn = self._reinforce_step
        self._learn(theta, step_fn, n)
        logits = theta.float().cpu().numpy()
        self.logits_ = logits
        if self.estimator == "expected":
            tau = _budget_shift(theta, self._target, self._tau, sizes=self._sizes)
            self.probabilities_ = torch.sigmoid(theta - tau).float().cpu().numpy()
        else:
            self.probabilities_ = torch.sigmoid(theta).float().cpu().numpy()
        if self.budget_ is None:
            selected = top_k_rows(logits, corpus.ids, self.k_)
        else:  # the logits walked down, each row kept while it fits
            selected = np.sort(self.budget_.fill(rank_order(logits, corpus.ids)))
        refine_start = time.perf_counter()
        self.swaps_ = 0
        if self.refine == "swap":
            rows = torch.as_tensor(selected, device=self.device_)
            found = swap_search(
                self.objective_, rows, max_rounds=self.max_swap_rounds, budget=self.budget_
            )
            self.swaps_ = found.swaps
            selected = np.sort(found.selected.cpu().numpy().astype(np.int64))
        self.refine_seconds_ = time.perf_counter() - refine_start
        scores = logits.astype(np.float64)
        if self.swaps_:  # the refined rows rank first
            scores[selected] += scores.max() - scores.min() + 1.0
        if self.max_similarity is not None:  # the cap (its exact check is the fit's tail)
            selected = self._top_k(scores, corpus.ids, what="the learner's ranking")
            scores[selected] += scores.max() - scores.min() + 1.0  # the capped rows rank first
        return selected, scores

    def _learn(self, theta: torch.Tensor, step_fn: StepFn, n: int) -> None:
        """The ``n_epochs_`` steps on ``theta`` (in place), logging every ``log_every``-th
        (about 50 points by default): ``history_`` and ``learn_seconds_``."""
        every = self.log_every or max(1, self.n_epochs_ // 50)
        bar = tqdm(
            range(self.n_epochs_),
            disable=not self.progress,
            desc="datamask",
            unit="step",
            dynamic_ncols=True,
        )
        # The logged objective stays on the device until the loop ends, read once then:
        # a float() per log point would stop a GPU's queue (nanoGPT reads it at intervals).
        # "seconds" is the host's time when the step was queued.
        logged: list[tuple[int, float, float, torch.Tensor]] = []
        learn_start = time.perf_counter()
        graph_before = self.objective_.graph_seconds()  # a graph built lazily by step 0
        with ExitStack() as repeats:
            for step in bar:
                if step == 1:  # step 0 may build the graph; the rest repeat its temporaries
                    repeats.enter_context(heap_for_repeats())
                lr = self._lr(step)
                running = step_fn(theta, lr, n)
                if step % every == 0 or step == self.n_epochs_ - 1:
                    logged.append((step, lr, time.perf_counter() - self._start, running))
                    if self.progress:  # sync point: only with a bar to show
                        bar.set_postfix(J=f"{float(running):.4f}", lr=f"{lr:.3g}")
        bar.close()
        values = torch.stack([v for *_, v in logged]).double().tolist()  # sync point: once
        graph_inside = self.objective_.graph_seconds() - graph_before
        # the last step is done here; a graph the first step built is graph_seconds_'s
        self.learn_seconds_ = time.perf_counter() - learn_start - graph_inside
        self.history_ += [
            {"step": step, "lr": lr, "objective": value, "seconds": seconds}
            for (step, lr, seconds, _), value in zip(logged, values, strict=True)
        ]

    def _reinforce_step(self, theta: torch.Tensor, lr: float, n: int) -> torch.Tensor:
        """One step of the reference estimator. Returns the mean reward of the group."""
        g = self.n_rollout
        b = max(2, int(round(self.partial * n)))
        # 1. Sample a batch: a random `partial` fraction of the documents.
        batch = torch.randperm(n, generator=self._torch_gen, device=self.device_)[:b]
        p = torch.sigmoid(theta[batch])
        # 2. Draw G masks over the batch from the current keep-probabilities.
        if self.mask_sampler == "bernoulli":
            masks = torch.bernoulli(p.expand(g, b), generator=self._torch_gen)
        else:  # exact-k: Gumbel top-k over the logits keeps round(select_ratio * b) rows
            k_b = max(1, int(round(self.select_ratio * b)))
            u = torch.rand(g, b, generator=self._torch_gen, device=self.device_).clamp_(1e-12, 1.0)
            keys = theta[batch][None] - torch.log(-torch.log(u))
            masks = torch.zeros(g, b, device=self.device_)
            masks.scatter_(1, keys.topk(k_b, dim=1).indices, 1.0)
            p = masks.mean(0)  # inclusion probabilities, estimated from the group
        # 3. Score every mask with J restricted to the batch.
        rewards = self.objective_.batch_values(batch, masks)
        # 4. Advantage: group-normalised rewards, or against the mean of the other G - 1.
        if self.baseline == "group":
            adv = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        else:
            others = (rewards.sum() - rewards) / (g - 1)
            adv = (rewards - others) / (rewards.std() + 1e-8)
        # 5. Policy gradient of log-prob of a Bernoulli mask w.r.t. its logits: (m - p).
        grad = adv @ (masks - p[None]) / g
        # 6. Ascend with the scheduled learning rate.
        theta.index_add_(0, batch, lr * grad)
        return rewards.mean()

    def _expected_step(self, theta: torch.Tensor, lr: float, n: int) -> torch.Tensor:
        """One step of the exact-gradient estimator. Returns E[J] (on the sampled clients).

        The same tensor ops at any size and no host read: nothing stops a GPU's queue
        (``benchmarks/learner_ops``)."""
        # 1. Sample the documents whose coverage this step measures (all when partial=1).
        b = max(1, int(round(self.partial * n)))  # a tiny group still measures one
        gen = self._torch_gen
        clients = None if b >= n else torch.randperm(n, generator=gen, device=self.device_)[:b]
        # 2. Keep-probabilities with a budget of k documents (T tokens) in expectation.
        self._tau, p = _budget_newton(theta, self._target, self._tau, self._reach, self._sizes)
        # 3. Score: E[J] in closed form, and its exact gradient (no rollouts to sample);
        #    under a token budget, the gain per token (as the cost-benefit greedy ranks).
        expected, grad = self.objective_.expected_grad(p, clients)
        if self._sizes is not None:
            grad = grad / self._sizes.to(grad.dtype)
        # 4. Step along dE/dp, not dE/dtheta = dE/dp * p(1 - p): the sigmoid's slope would
        #    freeze every document whose probability is near 0 or 1 (all of them, after a
        #    quality init), so a low-quality document that covers a hole could never rise.
        #    Scaled to unit RMS so the learning rate is a step in logit units.
        rms = torch.linalg.vector_norm(grad) * n**-0.5 + 1e-12
        # 5. Ascend with the scheduled learning rate (its largest move bounds the next tau).
        theta.addcdiv_(grad, rms, value=lr)
        self._reach = torch.linalg.vector_norm(grad, ord=math.inf) / rms * lr
        return expected

    # ----------------------------------------------------------------------------------------
    def selection(self) -> Selection:
        """The fitted result as a :class:`~datamask.data.Selection`, with the logits."""
        return Selection(
            selected=self.selected_,
            scores=self.scores_,
            meta={
                "method": self.method,
                "estimator": self.estimator,
                "terms": self.terms_,
                "seconds": self.fit_seconds_,
            },
            logits=self.logits_,
            probabilities=self.probabilities_,
        )

    def resolved_params(self) -> dict[str, Any]:
        """The steps and learning rates ``fit`` resolved (and the cap's, see the base)."""
        own = {"n_epochs_": self.n_epochs_, "max_lr_": self.max_lr_, "min_lr_": self.min_lr_}
        return {**own, **super().resolved_params()}

    def fit_stats(self) -> dict[str, Any]:
        """The base's, with the steps taken, their time, and the swap rounding's time and
        swaps."""
        own = {
            "n_epochs": self.n_epochs_,
            "learn_seconds": self.learn_seconds_,
            "refine_seconds": self.refine_seconds_,
            "swaps": self.swaps_,
        }
        return {**super().fit_stats(), **own}
