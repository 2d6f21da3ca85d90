"""The contract every objective term honours, and the context it is bound to.

A term scores a subset S of the corpus, higher is better, on a scale near [0, 1] so that
terms can be mixed by weights (see :mod:`datamask.objectives.combined`). Optimisers reach
terms only through these methods:

- ``bind(ctx)``: attach a :class:`TermContext` (features, quality, k, device, seeded
  generators, requested extra columns).
- ``value(selected)``: exact value on the whole corpus (evaluation, reports).
- ``batch_values(batch, masks)``: the value of each of G masks over a batch of rows, as one
  tensor op (the reference's REINFORCE rewards).
- ``expected(p, clients)``: a differentiable value of E[term] when each row is kept
  independently with probability ``p`` (the learner's exact-gradient estimator);
  ``expected_grad(p, clients, grad, weight)`` its value and gradient in one call (by
  autograd unless a term has the closed form).
- ``init_state(graph) / gains(state, candidates) / update(state, j)``: marginal gains for
  the greedy baselines (``update`` may change ``state`` in place).

What an optimiser may assume about a term is declared by class-level capability flags, not
found by ``isinstance``: :attr:`Term.submodular` (stale greedy gains are upper bounds, so
lazy evaluation is exact), :attr:`Term.modular` (a row's gain never depends on the
selection), :attr:`Term.has_graph` (a neighbour graph built by :meth:`Term.build_graph`),
:attr:`Term.per_document` (a mean over the documents, so groups add up),
:attr:`Term.has_expected` (an :meth:`Term.expected` estimator). A new term gets lazy
greedy evaluation by declaring ``submodular = True``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from .._device import make_generators, seed_streams

__all__ = ["HostGains", "Term", "TermContext"]


@dataclass(frozen=True)
class TermContext:
    """Everything a term is bound to for one run.

    Parameters
    ----------
    features : float tensor of shape (n_docs, d)
        Unit-norm embeddings on the compute device.
    quality : float tensor of shape (n_docs,) or None
        The combined quality score scaled to [0, 1], on the device.
    k : int
        Target subset size.
    device : torch.device
        Where ``features`` live.
    seed : int
        The run's seed. ``generator`` and ``rng`` come from the term's own stream of it
        (:func:`datamask._device.seed_streams`): terms never draw the same numbers.
    generator : torch.Generator
        Seeded torch generator on ``device``: every torch draw of the term goes through it
        (never torch's global RNG), so the same seed gives the same selection.
    rng : numpy.random.Generator
        Seeded numpy generator, for draws made on the host.
    columns : mapping of str to ndarray
        Extra per-document columns the term asked for in ``requires_columns`` (length
        n_docs each).
    max_neighbors : int, optional
        Cap on the default K of a graph term (facility location): the learner binds with
        ``LEARNER_MAX_NEIGHBORS``, the greedy with none (its own default K).
    floor : float tensor of shape (n_docs,), optional
        Coverage every document already has from documents outside the corpus, in [0, 1]
        (``Corpus.floor``: its best cosine to documents already kept, ``--given``).
        Facility location counts only what a selection adds above it; terms that cannot
        are refused a floor (:mod:`datamask.pipeline.given`).
    sizes : float tensor of shape (n_docs,), optional
        Each document's length under a token budget (:mod:`datamask.budget`); None under a
        document budget. Quality counts per token kept and facility location per token of
        the corpus (docs/method.md "Token budgets"); terms that cannot are refused sizes.
    budget : float, optional
        The token budget T with ``sizes`` (``k`` is then the count it is expected to keep).
    """

    features: torch.Tensor
    quality: torch.Tensor | None
    k: int
    device: torch.device
    seed: int
    generator: torch.Generator
    rng: np.random.Generator
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    max_neighbors: int | None = None
    floor: torch.Tensor | None = None
    sizes: torch.Tensor | None = None
    budget: float | None = None

    @classmethod
    def create(
        cls,
        features: torch.Tensor,
        quality: torch.Tensor | None,
        k: int,
        *,
        seed: int = 0,
        stream: np.random.SeedSequence | None = None,
        columns: Mapping[str, np.ndarray] | None = None,
        max_neighbors: int | None = None,
        floor: torch.Tensor | None = None,
        sizes: torch.Tensor | None = None,
        budget: float | None = None,
    ) -> TermContext:
        """A context with fresh generators on the device of ``features``, from ``stream``
        (the term's child of the run's seed; :meth:`Objective.bind` passes it), by default
        stream 1 of ``seed`` (the first term's)."""
        device = features.device
        if stream is None:
            stream = seed_streams(seed, 2)[1]
        gen, rng = make_generators(stream, device)
        return cls(
            features=features,
            quality=quality,
            k=int(k),
            device=device,
            seed=int(seed),
            generator=gen,
            rng=rng,
            columns=dict(columns or {}),
            max_neighbors=max_neighbors,
            floor=floor,
            sizes=sizes,
            budget=budget,
        )


class HostGains(ABC):
    """A term's greedy gains on the graph, kept on the host (:meth:`Term.host_gains`):
    ``gain(j)`` is the term's increase if row ``j`` were added to the rows picked so far,
    in float64; ``update(j)`` adds row ``j``. It starts at the empty selection."""

    @abstractmethod
    def gain(self, j: int) -> float: ...

    def update(self, j: int) -> None:  # noqa: B027  (a modular term keeps no state)
        return None


class Term(ABC):
    """One objective term. Subclasses set ``name`` and implement ``value``; the rest have
    defaults by differencing ``value`` (``batch_values``, the greedy ``init_state`` /
    ``gains`` / ``update``) or are optional (``expected``, for the learner's exact
    gradient). A learner-only term implements ``value`` and ``expected``; a value-only one
    (:class:`~datamask.objectives.ValueTerm`) only ``value``.

    Class attributes
    ----------------
    name : str
        Key of the term's value in reports (repeats get ``_2``, ``_3``, ...).
    submodular : bool, default=False
        Marginal gains never increase as the selection grows: the lazy greedy may use stale
        gains as upper bounds (an objective is lazy only when all its terms are).
    modular : bool, default=False
        A row's gain does not depend on the selection (``gains`` of any state are the
        gains of the empty one); the swap search then scores adds and drops by them.

    The swap search's scores (add and drop bounds, pair corrections, footprints) are not
    part of this contract: :mod:`datamask.optim.swaps` owns them, with a default for every
    term and faster adapters for the built-in ones.
    has_graph : bool, default=False
        The term counts greedy gains on a neighbour graph built by :meth:`build_graph`
        (timed; see :meth:`graph_summary`).
    per_document : bool, default=False
        The value is a mean over every document of the corpus of something that depends on
        the selection near it (facility location: its best cover). Over a partition whose
        groups hold each document's neighbours, the groups' values then add up, weighted
        by their sizes: a sharded run allocates its budget by the groups' marginal gains
        instead of selecting again from their candidates.
    has_expected : bool
        The term implements :meth:`expected` (set automatically when a subclass defines
        ``expected``).
    takes_floor : bool, default=False
        The term means something given documents kept before (``TermContext.floor``,
        ``--given``): facility location counts coverage above the floor, quality is a mean
        over the selection. A term without it is refused a floor at :meth:`bind`.
    takes_sizes : bool, default=False
        The term counts documents by their length under a token budget
        (``TermContext.sizes``; docs/method.md "Token budgets"). A term without it is
        refused a token budget at :meth:`bind`.
    requires_columns : tuple of str, default=()
        Extra corpus columns the term reads from ``ctx.columns``.
    _parameter_constraints : dict
        Constructor parameters and their accepted forms (see
        :func:`datamask._validation.validate_params`); what the registry and the CLI may
        pass to the term.
    """

    name: ClassVar[str]
    submodular: ClassVar[bool] = False
    modular: ClassVar[bool] = False
    has_graph: ClassVar[bool] = False
    per_document: ClassVar[bool] = False
    has_expected: ClassVar[bool] = False
    takes_floor: ClassVar[bool] = False
    takes_sizes: ClassVar[bool] = False
    requires_columns: ClassVar[tuple[str, ...]] = ()
    _parameter_constraints: ClassVar[dict[str, list]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "expected" in cls.__dict__ and "has_expected" not in cls.__dict__:
            cls.has_expected = True

    def bind(
        self,
        ctx: TermContext | torch.Tensor,
        quality: torch.Tensor | None = None,
        k: int | None = None,
    ) -> Term:
        """Attach the run's :class:`TermContext`. Returns self.

        ``bind(features, quality, k)`` (the former signature) still works: it builds a
        context with seed 0 and no extra columns.
        """
        if not isinstance(ctx, TermContext):
            if k is None:
                raise TypeError("bind(features, quality, k) needs k; or pass a TermContext.")
            ctx = TermContext.create(ctx, quality, k)
        missing = [c for c in self.requires_columns if c not in ctx.columns]
        if missing:
            raise ValueError(
                f"{type(self).__name__} requires the column(s) {missing}; the context holds "
                f"{sorted(ctx.columns)}."
            )
        if ctx.floor is not None and not self.takes_floor:
            raise ValueError(
                f"term {type(self).__name__} cannot be counted given documents already kept "
                "(--given): only facility location has a floor; use --algorithm Facility."
            )
        if ctx.sizes is not None and not self.takes_sizes:
            raise ValueError(
                f"term {type(self).__name__} cannot count documents by their length, so it "
                "cannot be optimised under a token budget (--budget-tokens / "
                "--select-token-ratio): use --algorithm Facility, or a document budget."
            )
        self.ctx_ = ctx
        self.features_ = ctx.features
        self.quality_ = ctx.quality
        self.k_ = int(ctx.k)
        return self

    @property
    def n_docs(self) -> int:
        return int(self.features_.shape[0])

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters declared in ``_parameter_constraints``, as set."""
        return {p: getattr(self, p) for p in self._parameter_constraints if hasattr(self, p)}

    @abstractmethod
    def value(self, selected: torch.Tensor) -> float:
        """Exact value of the term for the rows ``selected`` (int64 indices)."""

    def empty_value(self) -> float:
        """The value of the empty selection (the base of the first greedy gains by
        differencing, and the reward of a mask that keeps nothing). Default 0."""
        return 0.0

    def _value_of(self, rows: torch.Tensor) -> float:
        return self.empty_value() if len(rows) == 0 else float(self.value(rows))

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Values of G masks restricted to ``batch``.

        Default: ``value`` of the kept rows of ``batch``, mask by mask (one call each);
        the built-in terms override it with one tensor op.

        Parameters
        ----------
        batch : int64 tensor of shape (b,)
            Rows of the corpus in this batch.
        masks : float tensor of shape (G, b)
            1 where the row is kept in that rollout.

        Returns
        -------
        float tensor of shape (G,)
        """
        out = [self._value_of(batch[m > 0]) for m in masks]
        return torch.tensor(out, dtype=masks.dtype, device=masks.device)

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        """Differentiable E[term] under independent keep-probabilities ``p`` (shape (n_docs,)).

        ``clients`` optionally restricts a coverage-type term to a random subset of the rows it
        averages over (an unbiased stochastic estimate).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no expected-value estimator; use "
            "estimator='reinforce' (--estimator reinforce) or a greedy selector."
        )

    def expected_grad(
        self,
        p: torch.Tensor,
        clients: torch.Tensor | None,
        grad: torch.Tensor,
        weight: float = 1.0,
    ) -> torch.Tensor:
        """E[term] (as :meth:`expected`, detached), and ``weight * dE/dp`` added into ``grad``.

        The learner's step: one call per term and step, no host sync. Default: autograd
        through :meth:`expected`; the built-in terms override it with the closed form,
        a few tensor ops (autograd's backward of ``cumprod`` reads its input for zeros on
        the host, a sync per step on CUDA).

        Parameters
        ----------
        p : float tensor of shape (n_docs,)
            Keep-probabilities (not modified; no gradient needed).
        clients : int64 tensor of shape (c,) or None
            As in :meth:`expected`.
        grad : float tensor of shape (n_docs,)
            Accumulates ``weight * dE/dp`` in place.
        weight : float, default=1.0
            The term's weight in the objective.

        Returns
        -------
        float tensor of shape ()
        """
        p = p.detach().requires_grad_(True)
        with torch.enable_grad():
            value = self.expected(p, clients)
            (g,) = torch.autograd.grad(value, p)
        grad.add_(g, alpha=weight)
        return value.detach()

    # --- neighbour graph (terms with has_graph) ---------------------------------------------
    def build_graph(self) -> None:
        """Build the term's neighbour graph now (a no-op for terms without one)."""
        return None

    def graph_summary(self) -> dict[str, Any] | None:
        """``{"method", "n_neighbors", "n_probe", "seconds"}`` of a built graph, else None:
        the one summary of a neighbour graph (the objective sums its ``seconds``, a
        selection's summary adds its sampled recall)."""
        return None

    def graph_value(self, selected: torch.Tensor) -> float:
        """The value the graph greedy and the swap search maximise (``value`` unless the
        term counts coverage on a graph)."""
        return self.value(selected)

    # --- greedy marginal gains -------------------------------------------------------------
    # Defaults: gains by differencing ``value`` (one call per candidate), so a term that
    # implements only ``value`` (and ``expected``, for the learner) runs everywhere; the
    # built-in terms keep incremental states instead.
    def init_state(self, graph: bool = False) -> Any:
        """State of the empty selection. ``graph``: gains of a coverage term are counted on
        its K-nearest-neighbour graph instead of all pairs (other terms ignore it).
        Default: the rows picked so far (in pick order) and their value."""
        return {"rows": [], "value": self.empty_value()}

    def gains(self, state: Any, candidates: torch.Tensor) -> torch.Tensor:
        """Increase of the term if each candidate row were added (shape (c,))."""
        dev = self.features_.device
        base = torch.as_tensor(state["rows"], dtype=torch.long, device=dev)
        out = [self._value_of(torch.cat([base, c.view(1)])) - state["value"] for c in candidates]
        return torch.tensor(out, dtype=self.features_.dtype, device=dev)

    def update(self, state: Any, j: int) -> Any:
        """Add row ``j`` to the selection; returns the new state."""
        rows = [*state["rows"], int(j)]
        dev = self.features_.device
        value = self._value_of(torch.as_tensor(rows, dtype=torch.long, device=dev))
        return {"rows": rows, "value": value}

    def host_gains(self) -> HostGains | None:
        """The term's graph gains as numpy on the host, one row at a time, or None.

        :func:`~datamask.greedy.lazy.gain_order` runs on them when every term has them: a
        pick then costs a few microseconds of numpy, where ``gains`` and ``update`` cost
        tens of tensor ops, each a kernel launch and several a sync on CUDA. Default: none
        (``gain_order`` falls back to the tensor greedy).
        """
        return None

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"
