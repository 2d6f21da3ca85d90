"""One frozen :class:`ReportSpec`: everything ``datamask report`` (and
:func:`datamask.evaluation.browse.build_report`) runs with, declared once and checked once,
where the command line and the library meet.

Each setting is a field declared with :func:`~datamask.settings.setting_field` (its default,
what it accepts, its help) or shared with the spec that owns it
(:func:`~datamask.settings.shared_field`: ``dup_thresholds`` is
:class:`~datamask.evaluation.redundancy.DuplicateSettings`', ``split``, ``length_col`` and
``trust_selection`` are :class:`~datamask.io.input_settings.InputSettings`');
``datamask report``'s flags are made from these declarations. A spec that exists is
checked (``__post_init__``).

    >>> spec = ReportSpec.from_mapping({"n_topics": 4, "map_method": "tsne"})
    >>> spec.n_topics, spec.map_method, spec.dup_thresholds
    (4, 'tsne', (0.9, 0.95, 0.99))
    >>> ReportSpec(n_topics=0)
    Traceback (most recent call last):
    ...
    ValueError: n_topics must be >= 1; got 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import SEED, Interval, Options
from ..columns import Columns
from ..io.input_settings import InputSettings
from ..settings import Spec, setting_field, shared_field
from .redundancy import DuplicateSettings, check_thresholds

__all__ = ["ReportSpec"]


def _count(low: int) -> tuple:
    return (Interval(int, low, None, closed="left"),)


@dataclass(frozen=True)
class ReportSpec(Spec):
    """Everything a report runs with. Build it with :meth:`from_mapping` (flat keys, as the
    flags and :func:`~datamask.evaluation.browse.build_report`'s keywords give them) or
    directly.

    ``columns`` names the id, quality and embedding columns as ``select`` names them; names
    not given are resolved against the input's schema. One quality column is shown raw;
    several are shown as their weighted mix, each min-max scaled over the corpus.
    """

    split: str | None = shared_field(InputSettings, "split")
    columns: Columns = Columns()
    text_col: str | None = setting_field(
        None,
        (str, None),
        "column of the documents' text, for topic words, samples and pair examples "
        "(default: text, when present; else the page shows no texts)",
    )
    length_col: str | None = shared_field(InputSettings, "length_col")
    n_topics: int = setting_field(12, _count(1), "k-means topics of the embeddings")
    sample_size: int = setting_field(
        4000,
        _count(2),
        "seeded sample for the map, the topic fit, the text samples and the corpus's "
        "near-duplicate figures",
    )
    map_method: str = setting_field(
        "pca",
        (Options(str, ("pca", "tsne")),),
        "projection of the 2-D map (tsne: slower, needs scikit-learn)",
    )
    n_examples: int = setting_field(3, _count(0), "closest kept pairs shown per selection")
    dup_thresholds: tuple[float, ...] = shared_field(DuplicateSettings, "dup_thresholds")
    seed: int = setting_field(
        0, (SEED,), "seed of the sample, the topics and the map: the same seed, the same page"
    )
    batch_size: int = setting_field(16384, _count(1), "rows read at a time")
    trust_selection: bool = shared_field(InputSettings, "trust_selection")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "dup_thresholds", check_thresholds(self.dup_thresholds))
        if not isinstance(self.columns, Columns):
            raise TypeError(f"columns must be a datamask.Columns; got {self.columns!r}.")
