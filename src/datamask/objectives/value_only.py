"""Value-only terms: write ``value(selected)`` and nothing else, for quick experiments.

Every other method of the :class:`~datamask.objectives.Term` contract is derived from
``value``: batched rewards loop over the masks, greedy gains are differences
``value(S + {j}) - value(S)``, the swap search differences too. That costs one ``value``
call per mask, candidate or swap, so it suits small corpora and the reinforce estimator
(``MaskLearner(estimator="reinforce")``) or the greedy selectors; there is no
``expected`` (``estimator="expected"`` refuses the term with a message saying so).
"""

from __future__ import annotations

import torch

from .base import Term

__all__ = ["ValueTerm"]


class ValueTerm(Term):
    """A term defined by its value alone; subclass it and implement :meth:`value`.

    ``value`` receives int64 row indices (on the device) and reads the corpus from the
    attributes the context binds: ``features_`` (unit rows), ``quality_`` (normalised to
    [0, 1]), ``k_`` and ``ctx_.columns`` (the columns listed in ``requires_columns``).
    Parameters go in ``__init__`` (declare them in ``_parameter_constraints`` to pass them
    by name through the registry). Register the class with
    :func:`~datamask.objectives.register_term` to use it by name.

    Not declared submodular (``submodular = False``): the lazy greedy re-evaluates every
    gain. Declare ``submodular = True`` in the subclass when the value is.

    Examples
    --------
    >>> import torch
    >>> from datamask import MaskLearner, Objective, make_clustered
    >>> from datamask.objectives import ValueTerm
    >>> class MeanQualitySquared(ValueTerm):
    ...     name = "quality_sq"
    ...     def value(self, selected):
    ...         return float((self.quality_[selected] ** 2).mean())
    >>> corpus = make_clustered(200, 8, 4, seed=0)
    >>> learner = MaskLearner(Objective(MeanQualitySquared()), select_ratio=0.1,
    ...                       estimator="reinforce", n_epochs=5, n_rollout=8, device="cpu")
    >>> len(learner.fit(corpus).selected_)
    20
    """

    name = "value"
    has_expected = False

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} is a value-only term: it has no expected-value estimator; "
            "use estimator='reinforce' (--estimator reinforce) or a greedy selector "
            "(--method greedy)."
        )
