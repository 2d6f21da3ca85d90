"""``datamask apply``: from a selection to the filtered dataset (see :mod:`.core`)."""

from .core import REMOVED_FORMATS, SHARD_SUFFIXES, apply_selection
from .spec import ApplySpec

__all__ = ["REMOVED_FORMATS", "SHARD_SUFFIXES", "ApplySpec", "apply_selection"]
