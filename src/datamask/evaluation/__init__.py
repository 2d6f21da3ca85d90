"""Scoring selections (``datamask evaluate``), benchmarking selectors (``datamask bench``)
and the HTML page of selections (``datamask report``).

Plots live in :mod:`datamask.evaluation.plots` and import matplotlib only when drawn.
"""

from .bench import (
    DEFAULT_METHODS,
    BenchSpec,
    bench,
    format_markdown,
    measure_peak_rss,
    run_method,
)
from .browse import ReportSpec, build_report, render_html, write_report
from .evaluate_run import evaluate_file
from .evaluate_spec import EvaluateSpec
from .scores import (
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
    "BenchSpec",
    "EvaluateSpec",
    "ReportSpec",
    "bench",
    "build_report",
    "evaluate_file",
    "evaluate_selection",
    "facility_coverage",
    "format_markdown",
    "format_report",
    "length_stats",
    "mean_nn_similarity",
    "mean_pairwise_similarity",
    "measure_peak_rss",
    "read_selection",
    "render_html",
    "run_method",
    "write_report",
]
