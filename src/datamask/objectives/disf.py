"""DiSF: decorrelation of the subset's standardised features (dimensional collapse)."""

from __future__ import annotations

import torch

from .._validation import Interval
from .base import Term, TermContext
from .registry import register_term

__all__ = ["DiSF", "correlation_loss", "offdiag_correlation", "rank_one_offdiag"]

_EPS = 1e-8


def offdiag_correlation(
    cov: torch.Tensor, *, eps: float = _EPS, eps_mode: str = "clamp"
) -> torch.Tensor:
    """Sum of squared off-diagonal correlations of the covariance matrices ``cov``.

    The one correlation kernel of the package: the DiSF term (value, batched values,
    expectation, greedy state), the evaluation's DiSF loss and the original greedy's
    reference loss all end here.

    Parameters
    ----------
    cov : float tensor of shape (..., d, d)
        Covariance matrices (biased or unbiased: the correlation is the same up to ``eps``).
    eps : float, default=1e-8
        Guard of the variances.
    eps_mode : {"clamp", "add"}, default="clamp"
        ``clamp``: variances below ``eps`` are raised to it (datamask's terms: a constant
        column has correlation 0, and a non-constant one is exact). ``add``: ``eps`` is
        added to every variance, as the original DiSF's ``cal_corre`` does to the unbiased
        variance; :func:`datamask.greedy.disf.reference_correlation` needs it to reproduce
        the original's picks (its rank-two update ``candidate_losses`` expands the same
        formula).

    Returns
    -------
    float tensor of shape (...)
    """
    var = cov.diagonal(dim1=-2, dim2=-1)
    if eps_mode == "clamp":
        var = var.clamp_min(eps)
    elif eps_mode == "add":
        var = var + eps
    else:
        raise ValueError(f"eps_mode must be one of ['clamp', 'add']; got {eps_mode!r}.")
    inv_std = var.rsqrt()
    corr = cov * inv_std[..., :, None] * inv_std[..., None, :]
    return (corr * corr).sum((-2, -1)) - (corr.diagonal(dim1=-2, dim2=-1) ** 2).sum(-1)


def rank_one_offdiag(
    cov: torch.Tensor,
    cov_sq: torch.Tensor,
    u: torch.Tensor,
    a: float | torch.Tensor,
    b: float | torch.Tensor,
    *,
    eps: float = _EPS,
    eps_mode: str = "clamp",
) -> torch.Tensor:
    """:func:`offdiag_correlation` of ``a C + b u u^T`` for each row u of ``u`` (c, d),
    without a d x d matrix each: with ``D = 1 / diag`` the squared correlations sum to
    ``a^2 D^T (C o C) D + 2 a b (u o D)^T C (u o D) + b^2 (u^T (u o D))^2``, less the
    diagonal. ``cov_sq`` is ``C o C``; ``a`` and ``b`` are numbers or one per row (c,);
    ``eps`` guards the variances as in :func:`offdiag_correlation`. The one rank-one
    kernel of the DiSF term's greedy gains and of the token-budget ``disf-greedy``."""
    ac, bc = (a[:, None], b[:, None]) if isinstance(a, torch.Tensor) else (a, b)
    diag = ac * cov.diagonal()[None] + bc * u * u
    inv = 1.0 / (diag.clamp_min(eps) if eps_mode == "clamp" else diag + eps)
    ud = u * inv
    total_sq = (
        a * a * ((inv @ cov_sq) * inv).sum(1)
        + 2 * a * b * ((ud @ cov) * ud).sum(1)
        + b * b * (u * ud).sum(1) ** 2
    )
    return total_sq - ((diag * inv) ** 2).sum(1)


def _weighted_offdiag(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Mean squared off-diagonal correlation of ``x`` rows weighted by each row of ``weights``.

    ``weights`` has shape (G, n); returns shape (G,). Weights of 0/1 give the exact
    correlation of the kept rows.
    """
    n = weights.sum(1).clamp_min(1.0)  # (G,)
    mean = (weights @ x) / n[:, None]  # (G, d)
    if weights.shape[0] == 1:  # one weighting (expected/value): a plain 2-D product
        second = ((x * weights[0][:, None]).T @ x)[None] / n[:, None, None]
    else:
        second = torch.matmul((weights[:, :, None] * x[None]).transpose(1, 2), x)
        second = second / n[:, None, None]
    cov = second - mean[:, :, None] * mean[:, None, :]
    d = x.shape[1]
    return offdiag_correlation(cov) / (d * (d - 1))


def correlation_loss(x: torch.Tensor) -> float:
    """DiSF's loss: sum of squared off-diagonal entries of the correlation matrix of ``x``."""
    d = x.shape[1]
    w = torch.ones(1, x.shape[0], dtype=x.dtype, device=x.device)
    return float(_weighted_offdiag(w, x)[0] * d * (d - 1))


@register_term("DiSF")
class DiSF(Term):
    """``D(S) = 1 - L(S) / L_k``: L the sum of squared off-diagonal correlations of the
    standardised features, ``L_k`` its mean over random subsets of the target size k.

    The reference's ``DiSF`` (arXiv 2504.20644) minimises L(S). Dividing by ``L_k`` puts
    the term on the quality term's scale: 0 for a subset as collapsed as a random one of
    the same size, 1 for fully decorrelated features, negative for a more collapsed subset
    (top-k quality often is). A random baseline rather than the whole corpus, because L of
    a sample carries a finite-sample floor of about d^2 / k. Unscaled, ``1 - L / (d (d-1))``
    stays within 1% of 1 on real embeddings and ``lamb`` would ignore the term.
    ``expected`` is a mean-field relaxation: the correlation of the rows weighted by their
    keep-probabilities (not the exact expectation, which has no closed form); given
    ``clients``, over that random sample of rows only (a stochastic estimate, d^2 per row).

    Under a token budget (``TermContext.sizes``, lengths ``l``) L is the correlation of
    the kept *tokens*' features: each kept document weighs its length in the mean and the
    covariance (frequency weights, ``w_``), so a document cut in two halves of its
    embedding gives the same covariance and cutting changes nothing; ``L_k`` is taken over
    the same random subsets, weighted by their lengths (docs/method.md "Token budgets").
    With every ``l = 1`` it is the document term.

    Parameters
    ----------
    n_reference : int, default=4
        Random subsets averaged for ``L_k``. They are drawn from a CPU generator seeded 0,
        not the run's generator: ``L_k`` is a constant of the term (the scale of its
        values), so values stay comparable across seeds and devices.
    """

    name = "disf"
    takes_sizes = True
    _parameter_constraints = {"n_reference": [Interval(int, 1, None, closed="left")]}

    def __init__(self, n_reference: int = 4) -> None:
        self.n_reference = n_reference

    def bind(
        self,
        ctx: TermContext | torch.Tensor,
        quality: torch.Tensor | None = None,
        k: int | None = None,
    ) -> DiSF:
        super().bind(ctx, quality, k)
        features, k = self.features_, self.k_
        if features.shape[1] < 2:  # no pair of dimensions to decorrelate: undefined
            raise ValueError(
                f"the DiSF term scores the correlation between embedding dimensions and "
                f"needs embeddings of width >= 2; got width {features.shape[1]}. Use "
                "another diversity term (Facility, Pair_simi) for these embeddings."
            )
        gen = torch.Generator(device="cpu").manual_seed(0)  # a constant of the term, see above
        n = features.shape[0]
        size = min(max(int(k), 2), n)
        masks = torch.zeros(self.n_reference, n, dtype=features.dtype)
        for row in masks:
            row[torch.randperm(n, generator=gen)[:size]] = 1.0
        masks = masks.to(features.device)
        #: Each row's weight under a token budget, its length over the mean length
        #: (float64; the unit of the lengths cancels); else None.
        sizes = self.ctx_.sizes
        self.w_ = None if sizes is None else sizes / sizes.mean()
        if self.w_ is not None:  # the random subsets' tokens
            masks = masks * self.w_.to(masks.dtype)
        self.scale_ = float(torch.cat([_weighted_offdiag(m[None], features) for m in masks]).mean())
        self.scale_ = max(self.scale_, _EPS)
        return self

    def _weights(self, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` (G, len(rows)) times the rows' lengths under a token budget."""
        return mask if self.w_ is None else mask * self.w_[rows].to(mask.dtype)

    def value(self, selected: torch.Tensor) -> float:
        w = torch.ones(1, len(selected), dtype=self.features_.dtype, device=self.features_.device)
        w = self._weights(selected, w)
        return float(1.0 - _weighted_offdiag(w, self.features_[selected])[0] / self.scale_)

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        xb = self.features_[batch]
        chunk = max(1, (1 << 25) // (len(batch) * xb.shape[1]))
        masks = self._weights(batch, masks)
        return torch.cat([1.0 - _weighted_offdiag(m, xb) / self.scale_ for m in masks.split(chunk)])

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        if self.w_ is not None:  # keep-probabilities times lengths: the expected tokens
            p = p * self.w_.to(p.dtype)
        if clients is None:
            return 1.0 - _weighted_offdiag(p[None], self.features_)[0] / self.scale_
        # A random sample of rows: the same weighted correlation, O(|clients| d^2) a step.
        return 1.0 - _weighted_offdiag(p[clients][None], self.features_[clients])[0] / self.scale_

    # Greedy state: count, feature sum and second-moment sum of the selection (under a
    # token budget: its tokens, and the sums weighted by the lengths).
    def init_state(self, graph: bool = False) -> tuple[float, torch.Tensor, torch.Tensor]:
        d = self.features_.shape[1]
        z = self.features_.new_zeros
        return 0, z(d, dtype=torch.float64), z(d, d, dtype=torch.float64)

    def gains(
        self, state: tuple[int, torch.Tensor, torch.Tensor], candidates: torch.Tensor
    ) -> torch.Tensor:
        """Exact gains of adding each candidate, by a rank-one covariance update (see
        :meth:`_rank_one_values`): two GEMMs for all candidates, no d x d matrix each."""
        count, total, second = state
        before = self._loss_from_moments(count, total, second) if count > 0 else 1.0
        if count == 0:  # one row has no variance: every correlation is 0
            return torch.zeros(len(candidates), dtype=self.features_.dtype, device=total.device)
        weights = self._row_w(candidates)
        after = self._rank_one_values(count, total, second, candidates, +1, weights)
        return (after - before).to(self.features_.dtype)

    def single_changes(
        self, selected: torch.Tensor, adds: torch.Tensor, drops: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The term's gain if each of ``adds`` were added to ``selected`` alone, and its loss
        if each of ``drops`` (rows of ``selected``) were dropped alone (float64); exact,
        O(d^2) a row as matrix products (the swap search's DiSF scores)."""
        x = self.features_[selected].double()
        if self.w_ is None:
            count, total, second = len(selected), x.sum(0), x.T @ x
        else:
            wx = self.w_[selected, None] * x
            count, total, second = float(self.w_[selected].sum()), wx.sum(0), wx.T @ x
        before = self._loss_from_moments(count, total, second)
        gain = self._rank_one_values(count, total, second, adds, +1, self._row_w(adds)) - before
        loss = before - self._rank_one_values(count, total, second, drops, -1, self._row_w(drops))
        return gain, loss

    def _row_w(self, rows: torch.Tensor) -> torch.Tensor | None:
        return None if self.w_ is None else self.w_[rows]

    def _rank_one_values(
        self,
        count: int,
        total: torch.Tensor,
        second: torch.Tensor,
        rows: torch.Tensor,
        sign: int,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The term's value after adding (``sign=+1``) or removing (-1) each row alone.

        With mean m and covariance C of the c rows and ``u = x - m``, adding x gives
        ``C' = a C + b u u^T`` with ``a = c / (c + 1)``, ``b = c / (c + 1)^2``; removing it,
        ``a = c / (c - 1)``, ``b = -c / (c - 1)^2``; :func:`rank_one_offdiag` scores every
        candidate with two GEMMs instead of one d x d matrix each. Under a token budget
        ``count`` is the selection's tokens W and row x weighs ``weights`` l:
        ``a = W / (W +- l)``, ``b = +-W l / (W +- l)^2`` (a row each).
        """
        d = self.features_.shape[1]
        mean = total / count
        cov = second / count - mean[:, None] * mean[None, :]
        if weights is None:
            c1 = count + sign
            if c1 < 1:
                return torch.ones(len(rows), dtype=torch.float64, device=total.device)
            a, b = count / c1, sign * count / c1**2
        else:  # a row each, as columns; dropping the only document leaves none (value 1)
            c1 = count + sign * weights
            alone = c1 <= count * 1e-9
            c1 = torch.where(alone, 1.0, c1)
            a_rows, b_rows = count / c1, sign * count * weights / c1**2
        cov_sq = cov * cov
        out = []
        step = max(1, (1 << 24) // d)
        for lo in range(0, len(rows), step):
            part = rows[lo : lo + step]
            u = self.features_[part].double() - mean[None]  # (c, d)
            if weights is not None:
                a, b = a_rows[lo : lo + step], b_rows[lo : lo + step]
            off = rank_one_offdiag(cov, cov_sq, u, a, b)
            out.append(1.0 - off / (d * (d - 1)) / self.scale_)
        values = torch.cat(out)
        return values if weights is None else torch.where(alone, 1.0, values)

    def _loss_from_moments(self, count: int, total: torch.Tensor, second: torch.Tensor) -> float:
        d = total.shape[0]
        mean = total / count
        cov = second / count - mean[:, None] * mean[None, :]
        off = offdiag_correlation(cov)
        return float(1.0 - off / (d * (d - 1)) / self.scale_)

    def update(
        self, state: tuple[int, torch.Tensor, torch.Tensor], j: int
    ) -> tuple[int, torch.Tensor, torch.Tensor]:
        count, total, second = state
        x = self.features_[j].double()
        if self.w_ is not None:  # weighted by the length: the tokens of the selection
            w = float(self.w_[j])
            return count + w, total + w * x, second + w * x[:, None] * x[None, :]
        return count + 1, total + x, second + x[:, None] * x[None, :]
