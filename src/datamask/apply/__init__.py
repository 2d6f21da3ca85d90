"""``datamask apply``: from a selection to the filtered dataset (see :mod:`.core`)."""

from .core import REMOVED_FORMATS, SHARD_SUFFIXES, apply_selection

__all__ = ["REMOVED_FORMATS", "SHARD_SUFFIXES", "apply_selection"]
