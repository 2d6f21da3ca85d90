"""What the phases of one claimed run read and hand each other (:mod:`.runner`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import SelectSpec
from ..io.fs import Location
from ..io.shards import ShardInfo, ShardSource
from .check.validate import QualityRange
from .executors import Runner
from .paths import WorkDir

__all__ = ["Checked", "RunContext"]


@dataclass
class RunContext:
    """What every phase of one claimed run reads: its input, places, settings and runner."""

    source: ShardSource
    files: list[Path | Location]
    dirs: WorkDir
    spec: SelectSpec
    runner: Runner
    progress: bool
    given: tuple[Any, Any] = (None, None)  # --given and --given-selection, as steps read them

    @property
    def out(self) -> Path | Location:
        """The output folder."""
        return self.dirs.output

    @property
    def work(self) -> Path | Location:
        """The work dir."""
        return self.dirs.root


@dataclass
class Checked:
    """Phase 1's facts: the shards (the input's, ``--given``'s), their checksums and
    quality range, the budget, the work dir's record and the ``--given`` kept rows; the
    k-means fit, the token count and the seconds of the check pass."""

    infos: list[ShardInfo]
    docs: list[ShardInfo]
    checksums: dict[str, str]
    quality_range: QualityRange
    k_total: int
    record: dict[str, Any]
    resumed: bool
    kept: dict[str, Any] | None
    rate: tuple[int, int]
    fitted: dict[str, Any] | None = None  # the k-means fit before the check pass
    tokens: Any = None  # the TokenPlan, under a token budget (counted by the check pass)
    check_s: float = 0.0  # the check pass's seconds (with the spills, cluster partition)

    @property
    def n_total(self) -> int:
        return sum(i.num_rows for i in self.infos)
