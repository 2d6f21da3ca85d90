"""The renamed setting names: the old ones still resolve to the new, and warn."""

from __future__ import annotations

import importlib

import pytest

import datamask.config
import datamask.settings
from datamask._validation import option_field, setting_field
from datamask.cli.args import add_flag, add_flags, add_option, add_options


def test_the_old_options_module_aliases_the_new_names_and_warns():
    with pytest.warns(DeprecationWarning, match="datamask.options is deprecated"):
        old = importlib.reload(importlib.import_module("datamask.options"))
    assert old.Option is datamask.settings.Setting
    assert old.options is datamask.settings.section_settings
    assert old.selector_options is datamask.config.selector_settings
    assert old.term_options is datamask.config.term_settings
    assert (option_field, add_option, add_options) == (setting_field, add_flag, add_flags)


def test_a_declared_field_reads_back_as_a_setting():
    names = [s.name for s in datamask.settings.section_settings(datamask.config.SelectorSpec)]
    assert names[:2] == ["method", "select_ratio"]
    by_name = {s.name: s for s in datamask.config.selector_settings()}
    assert "n_epochs" in by_name and by_name["n_epochs"].owners == ("mask",)
