"""Settings read back from their declarations."""

from __future__ import annotations

import importlib

import pytest

import datamask.config
import datamask.settings


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("datamask._validation", "option_field"),
        ("datamask.cli.args", "add_option"),
        ("datamask.cli.args", "add_options"),
        ("datamask.evaluation.report_spec", "REPORT_CONSTRAINTS"),
    ],
)
def test_the_deprecated_aliases_are_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("datamask.options")


def test_a_declared_field_reads_back_as_a_setting():
    names = [s.name for s in datamask.settings.section_settings(datamask.config.SelectorSpec)]
    assert names[:2] == ["method", "select_ratio"]
    by_name = {s.name: s for s in datamask.config.selector_settings()}
    assert "n_epochs" in by_name and by_name["n_epochs"].owners == ("mask",)


def test_one_count_checker_for_every_hand_checked_count():
    """threads, n_probe, n_neighbors and chunk_docs are checked by check_count, the COUNT
    declaration's check (issue 34): one wording, a TypeError for a non-integer."""
    import numpy as np
    import torch

    from datamask._device import resolve_threads
    from datamask._validation import check_count
    from datamask.neighbors import knn_graph
    from datamask.objectives import FacilityLocation

    assert check_count("n", np.int64(3)) == 3 and isinstance(check_count("n", np.int64(3)), int)
    for value, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError)):
        for name, call in (
            ("threads", lambda v: resolve_threads(v)),
            ("n_probe", lambda v: knn_graph(torch.eye(4), 2, method="ivf", n_probe=v)),
            ("n_neighbors", lambda v: FacilityLocation(n_neighbors=v).bind(torch.eye(4), None, 2)),
        ):
            with pytest.raises(error, match=rf"^{name} must be >= 1; got {value!r}\.$"):
                call(value)
