"""DiSF: decorrelation of the subset's standardised features (dimensional collapse)."""

from __future__ import annotations

import torch

from .base import Term

__all__ = ["DiSF", "correlation_loss"]

_EPS = 1e-8


def _weighted_offdiag(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Mean squared off-diagonal correlation of ``x`` rows weighted by each row of ``weights``.

    ``weights`` has shape (G, n); returns shape (G,). Weights of 0/1 give the exact
    correlation of the kept rows.
    """
    n = weights.sum(1).clamp_min(1.0)  # (G,)
    mean = (weights @ x) / n[:, None]  # (G, d)
    second = torch.einsum("gn,nd,ne->gde", weights, x, x) / n[:, None, None]
    cov = second - mean[:, :, None] * mean[:, None, :]
    inv_std = cov.diagonal(dim1=1, dim2=2).clamp_min(_EPS).rsqrt()
    corr = cov * inv_std[:, :, None] * inv_std[:, None, :]
    d = x.shape[1]
    off = (corr * corr).sum((1, 2)) - (corr.diagonal(dim1=1, dim2=2) ** 2).sum(1)
    return off / (d * (d - 1))


def correlation_loss(x: torch.Tensor) -> float:
    """DiSF's loss: sum of squared off-diagonal entries of the correlation matrix of ``x``."""
    d = x.shape[1]
    w = torch.ones(1, x.shape[0], dtype=x.dtype, device=x.device)
    return float(_weighted_offdiag(w, x)[0] * d * (d - 1))


class DiSF(Term):
    """``D(S) = 1 - mean_{a != b} C_ab^2``, C the correlation matrix of the features of S.

    The reference's ``DiSF`` (arXiv 2504.20644) minimises the *sum* of squared off-diagonal
    correlations; dividing by d (d - 1) keeps the same order and puts the term on [0, 1].
    ``expected`` is a mean-field relaxation: the correlation of the rows weighted by their
    keep-probabilities (not the exact expectation, which has no closed form).
    """

    name = "disf"

    def value(self, selected: torch.Tensor) -> float:
        w = torch.ones(1, len(selected), dtype=self.features_.dtype, device=self.features_.device)
        return float(1.0 - _weighted_offdiag(w, self.features_[selected])[0])

    def batch_values(self, batch: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        xb = self.features_[batch]
        chunk = max(1, (1 << 25) // (len(batch) * xb.shape[1]))
        return torch.cat([1.0 - _weighted_offdiag(m, xb) for m in masks.split(chunk)])

    def expected(self, p: torch.Tensor, clients: torch.Tensor | None = None) -> torch.Tensor:
        return 1.0 - _weighted_offdiag(p[None], self.features_)[0]

    # Greedy state: count, feature sum and second-moment sum of the selection.
    def init_state(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        d = self.features_.shape[1]
        z = self.features_.new_zeros
        return 0, z(d, dtype=torch.float64), z(d, d, dtype=torch.float64)

    def gains(
        self, state: tuple[int, torch.Tensor, torch.Tensor], candidates: torch.Tensor
    ) -> torch.Tensor:
        count, total, second = state
        d = self.features_.shape[1]
        before = self._loss_from_moments(count, total, second) if count >= 1 else 1.0
        out = []
        chunk = max(1, (1 << 24) // (d * d))
        for c in candidates.split(chunk):
            xc = self.features_[c].double()  # (c, d)
            n1 = count + 1
            mean = (total[None] + xc) / n1
            sec = (second[None] + xc[:, :, None] * xc[:, None, :]) / n1
            cov = sec - mean[:, :, None] * mean[:, None, :]
            inv = cov.diagonal(dim1=1, dim2=2).clamp_min(_EPS).rsqrt()
            corr = cov * inv[:, :, None] * inv[:, None, :]
            off = (corr * corr).sum((1, 2)) - (corr.diagonal(dim1=1, dim2=2) ** 2).sum(1)
            after = 1.0 - off / (d * (d - 1))
            out.append((after - before).to(self.features_.dtype))
        return torch.cat(out)

    @staticmethod
    def _loss_from_moments(count: int, total: torch.Tensor, second: torch.Tensor) -> float:
        d = total.shape[0]
        mean = total / count
        cov = second / count - mean[:, None] * mean[None, :]
        inv = cov.diagonal().clamp_min(_EPS).rsqrt()
        corr = cov * inv[:, None] * inv[None, :]
        off = (corr * corr).sum() - (corr.diagonal() ** 2).sum()
        return float(1.0 - off / (d * (d - 1)))

    def update(
        self, state: tuple[int, torch.Tensor, torch.Tensor], j: int
    ) -> tuple[int, torch.Tensor, torch.Tensor]:
        count, total, second = state
        x = self.features_[j].double()
        return count + 1, total + x, second + x[:, None] * x[None, :]
