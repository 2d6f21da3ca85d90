"""Bench figures (matplotlib, PNG). matplotlib is imported only when a figure is drawn.

- :func:`plot_learning_curve`: the learner's running objective per step against the final
  objective of lazy greedy (and the learner's own exact final J);
- :func:`plot_objective_vs_time`: every method's J against its wall time, with the
  greedy selectors' running objective as they add documents;
- :func:`plot_selection_map`: a 2-D PCA (or t-SNE) map of the documents with each method's
  selection on top, like the reference paper's feature visualisation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..io.atomic import atomic_write

__all__ = [
    "plot_learning_curve",
    "plot_objective_vs_time",
    "plot_selection_map",
    "literal",
    "literal_text",
    "project_2d",
    "require_matplotlib",
]

_DPI = 80
_COLORS = {
    "mask": "tab:red",
    "greedy": "tab:blue",
    "stochastic-greedy": "tab:cyan",
    "disf-greedy": "tab:purple",
    "topk": "tab:orange",
    "random": "tab:gray",
}


def require_matplotlib(tsne: bool = False) -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or an ImportError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "Please install `matplotlib` to draw bench plots (`pip install datamask[plot]`), "
            "or pass --no-plots."
        ) from None
    if tsne:
        try:
            import sklearn.manifold  # noqa: F401
        except ImportError:
            raise ImportError(
                "Please install `scikit-learn` for the t-SNE map "
                "(`pip install datamask[plot]`), or use --map pca."
            ) from None
    return plt


_F = TypeVar("_F", bound=Callable[..., Any])


def literal(text: Any) -> str:
    """A user's text (a file, column or selection name) as a figure draws it: as written.
    Its dollar signs are escaped, so ``$x$``, ``a_b^c`` or ``$\\frac{a}$`` is never read as
    mathtext nor fails to parse; the figure's own mathtext (log-axis ticks) is untouched."""
    return str(text).replace("$", r"\$")


def literal_text(draw: _F) -> _F:
    """Run a figure-drawing function with TeX off (matplotlib reads ``text.usetex`` when a
    ``Text`` is made: a caller's ``usetex=True`` would send every name through LaTeX); the
    caller's own matplotlib settings are restored after. Names go through :func:`literal`."""

    @functools.wraps(draw)
    def run(*args: Any, **kwargs: Any) -> Any:
        plt = require_matplotlib()
        with plt.rc_context({"text.usetex": False}):
            return draw(*args, **kwargs)

    return run  # type: ignore[return-value]


def _color(label: str) -> str:
    return _COLORS.get(label, "tab:green")


def _save(fig: Any, path: Path) -> Path:

    path = Path(path)
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=_DPI, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


@literal_text
def plot_learning_curve(runs: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """The learner's running objective (``history``) per step, and the greedy J line."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    by = {r["label"]: r for r in runs}
    mask = by.get("mask")
    if mask is not None and mask.get("history"):
        steps = [h["step"] for h in mask["history"]]
        ax.plot(
            steps,
            [h["objective"] for h in mask["history"]],
            color=_color("mask"),
            label="learner: running objective",
        )
        ax.scatter(
            [steps[-1]],
            [mask["terms"]["J"]],
            color=_color("mask"),
            marker="*",
            s=90,
            zorder=3,
            label=f"learner: exact J of its top-k = {mask['terms']['J']:.4f}",
        )
    for label in ("greedy", "stochastic-greedy", "disf-greedy", "topk", "random"):
        r = by.get(label)
        if r is not None and "terms" in r:
            ax.axhline(
                r["terms"]["J"],
                color=_color(label),
                ls="--",
                lw=1,
                label=f"{literal(label)}: J = {r['terms']['J']:.4f}",
            )
    ax.set_xlabel("learner step")
    ax.set_ylabel("objective J")
    ax.set_title("Optimisation curve of the learner vs the baselines")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.grid(alpha=0.3)
    return _save(fig, Path(path))


@literal_text
def plot_objective_vs_time(runs: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """J against wall time (log scale) for every method, with running curves where known."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for r in runs:
        if "terms" not in r:
            continue
        c = _color(r["label"])
        hist = r.get("history") or []
        if hist:
            ax.plot(
                [max(h["seconds"], 1e-3) for h in hist],
                [h["objective"] for h in hist],
                color=c,
                lw=1,
                alpha=0.6,
            )
        ax.scatter(
            [max(r["seconds"], 1e-3)],
            [r["terms"]["J"]],
            color=c,
            s=40,
            zorder=3,
            label=f"{literal(r['label'])} ({r['seconds']:.2f}s, J={r['terms']['J']:.4f})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("wall time of fit (s, log)")
    ax.set_ylabel("objective J")
    ax.set_title("Objective vs time (lines: running objective)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.grid(alpha=0.3, which="both")
    lo = min((r["terms"]["J"] for r in runs if "terms" in r), default=0.0)
    hi = max((r["terms"]["J"] for r in runs if "terms" in r), default=1.0)
    pad = 0.15 * (hi - lo) + 1e-3
    ax.set_ylim(lo - pad, hi + pad)
    return _save(fig, Path(path))


def project_2d(features: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """2-D coordinates of ``features`` rows by PCA (SVD) or t-SNE (scikit-learn), shape
    ``(n, 2)`` for any ``n >= 1``.

    Points that do not span a plane get zeros on the missing axes (one point, a width-1
    embedding, or all points equal: all at the origin). t-SNE needs more points than its
    perplexity (2 at least): one or two points, and identical points (no distances to
    fit), are placed by PCA.
    """
    x = np.asarray(features, dtype=np.float32)
    centred = x - x.mean(0)
    spread = bool(len(x) and np.any(centred))
    if method == "tsne" and len(x) > 2 and spread:
        require_matplotlib(tsne=True)
        from sklearn.manifold import TSNE

        perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
        return TSNE(
            n_components=2, init="pca", random_state=seed, perplexity=perplexity
        ).fit_transform(x)
    if method not in ("pca", "tsne"):
        raise ValueError(f"method must be 'pca' or 'tsne'; got {method!r}.")
    out = np.zeros((len(x), 2), dtype=np.float32)
    if spread:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[:2].T
        out[:, : xy.shape[1]] = xy
    return out


@literal_text
def plot_selection_map(
    features: np.ndarray,
    runs: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    method: str = "pca",
    max_points: int = 3000,
    seed: int = 0,
) -> Path:
    """One panel per method: a sample of all documents in grey, its selection in colour."""
    plt = require_matplotlib(tsne=method == "tsne")
    with_sel = [r for r in runs if "selected" in r]
    n = len(features)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(n, max_points), replace=False))
    xy = project_2d(np.asarray(features)[rows], method=method, seed=seed)
    cols = min(3, max(1, len(with_sel)))
    nrow = (len(with_sel) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(3.2 * cols, 3.0 * nrow), squeeze=False)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    for ax, r in zip(axes.ravel(), with_sel, strict=False):
        keep = np.isin(rows, r["selected"])
        ax.scatter(xy[:, 0], xy[:, 1], s=2, c="lightgray", linewidths=0)
        ax.scatter(xy[keep, 0], xy[keep, 1], s=5, c=_color(r["label"]), linewidths=0)
        j = r["terms"]["J"]
        kept = f"\n{r['k']:,} docs, {r['tokens']:,.0f} tokens" if "tokens" in r else ""
        ax.set_title(f"{literal(r['label'])}  J={j:.4f}{kept}", fontsize=8)
    for ax in axes.ravel()[len(with_sel) :]:
        ax.axis("off")
    fig.suptitle(
        f"{method.upper()} map of {len(rows)} of {n} documents; selected in colour", fontsize=9
    )
    return _save(fig, Path(path))
