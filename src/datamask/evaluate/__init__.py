"""Scoring selections (``datamask evaluate``) and benchmarking selectors (``datamask bench``).

Plots live in :mod:`datamask.evaluate.plots` and import matplotlib only when drawn.
"""

from .bench import DEFAULT_METHODS, bench, format_markdown, measure_peak_rss, run_method
from .report import (
    evaluate_selection,
    facility_coverage,
    format_report,
    length_stats,
    mean_nn_similarity,
    mean_pairwise_similarity,
    read_selection,
)

__all__ = [
    "DEFAULT_METHODS",
    "bench",
    "evaluate_selection",
    "facility_coverage",
    "format_markdown",
    "format_report",
    "length_stats",
    "mean_nn_similarity",
    "mean_pairwise_similarity",
    "measure_peak_rss",
    "read_selection",
    "run_method",
]
