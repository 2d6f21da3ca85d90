"""Deprecated: the old name of :mod:`datamask.settings` (importing it warns).

``Option`` is now :class:`~datamask.settings.Setting`, ``options()``
:func:`~datamask.settings.section_settings`, ``selector_options()`` and ``term_options()``
:func:`~datamask.config.selector_settings` and :func:`~datamask.config.term_settings`.
"""

from __future__ import annotations

import warnings

from .config import selector_settings as selector_options
from .config import term_settings as term_options
from .settings import Setting as Option
from .settings import own_defaults
from .settings import section_settings as options

__all__ = ["Option", "options", "own_defaults", "selector_options", "term_options"]

warnings.warn(
    "datamask.options is deprecated; use datamask.settings (Setting, section_settings) and "
    "datamask.config (selector_settings, term_settings).",
    DeprecationWarning,
    stacklevel=2,
)
