"""Where a sharded run keeps its files: one definition per path, read by every step that
writes or reads it. ``NNNNN`` is a group id (or a bucket, a shard, a part), five digits.

``WORK`` (``OUT/_work`` unless ``--work-dir``), in the order the phases write it::

    settings.json                       the settings and input fingerprint (the claim)
    ids/                                check: id hashes by bucket, done/bucket=NNNNN.json
    clusters/kmeans/                    plan: the sample's parts, the tree
    clusters/shard-NNNNN.parquet        plan: a shard's rows sorted by leaf (its spill)
    clusters/groups/group-NNNNN.*       plan: a cluster group's one object, its marker
    given/kept.parquet                  --given: KEPT's rows (completions/given marks it)
    groups/NNNNN.parquet                select: a group's rows, scores and probabilities
    graphs/NNNNN.npz                    select: a group's K-NN graph (exchange, cover)
    candidates/NNNNN.parquet            select: a group's candidates in pick order
    candidates/NNNNN.want.json          allocation: a group asked for more candidates
    completions/NNNNN, completions/global  select, allocation: the phases' markers
    exchange/NNNNN.{parquet,json}       exchange round: re-priced candidates, marker
    tokens/offer-NNNNN.parquet          token budget: a group's offers for the fill
    cover/kept-NNNNN.{parquet,json}     cover: a group's kept rows, marker
    cover/NNNNN.json                    cover: a group's cover marker
    keep/bucket=NNNNN/part-NNNNN.parquet   keep lists: kept rows by input bucket

``OUT``: ``selected/part-NNNNN.parquet`` (or ``part-global.parquet``),
``covered/part-NNNNN.parquet``, ``manifest.json``.
"""

from __future__ import annotations

from pathlib import Path

from ..io.fs import storage_path

__all__ = [
    "GLOBAL_PART",
    "bucket_marker",
    "candidates_path",
    "clusters_dir",
    "completion_path",
    "cover_marker",
    "cover_part_path",
    "exchange_marker",
    "exchange_path",
    "given_kept_path",
    "given_marker",
    "global_marker",
    "global_part_path",
    "graph_path",
    "group_object_marker",
    "group_object_path",
    "group_rows_path",
    "id_buckets_dir",
    "keep_bucket_marker",
    "keep_bucket_path",
    "keep_group_marker",
    "kept_rows_marker",
    "kept_rows_path",
    "offer_path",
    "part_path",
    "selected_dir",
    "spill_path",
    "spills_released_path",
    "tokens_fill_marker",
    "want_path",
]

#: The selected part of a run whose groups were combined by one central round.
GLOBAL_PART = "part-global.parquet"


def _group_name(gid: int) -> str:
    return f"{gid:05d}"


# --- OUT ------------------------------------------------------------------------------------
def selected_dir(out_dir: str | Path) -> Path:
    """The output dataset of selected ids."""
    return storage_path(out_dir) / "selected"


def part_path(out_dir: str | Path, gid: int) -> Path:
    """The selected-ids file of one group in the output dataset."""
    return selected_dir(out_dir) / f"part-{_group_name(gid)}.parquet"


def global_part_path(out_dir: str | Path) -> Path:
    """The selected-ids file of the central round (every group's rows in one part)."""
    return selected_dir(out_dir) / GLOBAL_PART


def cover_part_path(out_dir: str | Path, gid: int) -> Path:
    """One group's part of the cover dataset."""
    return storage_path(out_dir) / "covered" / f"part-{_group_name(gid)}.parquet"


# --- WORK: check and plan -------------------------------------------------------------------
def id_buckets_dir(work_dir: str | Path) -> Path:
    """Where the scan steps file the id hashes (``WORK/ids``)."""
    return storage_path(work_dir) / "ids"


def bucket_marker(ids_dir: str | Path, bucket: int) -> Path:
    """What a bucket step found, written once it has looked at every shard's file."""
    return storage_path(ids_dir) / "done" / f"bucket={bucket:05d}.json"


def clusters_dir(work_dir: str | Path) -> Path:
    """The cluster partition's files: the k-means sample and tree, the spills, the groups."""
    return storage_path(work_dir) / "clusters"


def spill_path(clusters: str | Path, shard_index: int) -> Path:
    """The spill of one shard: its rows sorted by leaf (``partition.spill_shard``)."""
    return storage_path(clusters) / f"shard-{shard_index:05d}.parquet"


def spills_released_path(clusters: str | Path) -> Path:
    """The marker that every group is gathered and the spills deleted
    (``gather.release_spills``): a spill's counts alone then mark it done."""
    return storage_path(clusters) / "spills-released.json"


def group_object_path(work_dir: str | Path, gid: int) -> Path:
    """The one object a cluster group's steps read."""
    return clusters_dir(work_dir) / "groups" / f"group-{_group_name(gid)}.parquet"


def group_object_marker(work_dir: str | Path, gid: int) -> Path:
    """The gather step's marker for one group object."""
    return clusters_dir(work_dir) / "groups" / f"group-{_group_name(gid)}.json"


def given_kept_path(work_dir: str | Path) -> Path:
    """KEPT's kept rows: id and unit embedding, what every group's floor is taken against."""
    return storage_path(work_dir) / "given" / "kept.parquet"


def given_marker(work_dir: str | Path) -> Path:
    """The marker of KEPT's rows, written once :func:`given_kept_path` is."""
    return storage_path(work_dir) / "completions" / "given"


# --- WORK: select, allocate, exchange -------------------------------------------------------
def completion_path(work_dir: str | Path, gid: int) -> Path:
    """The marker a finished group leaves behind."""
    return storage_path(work_dir) / "completions" / _group_name(gid)


def global_marker(work_dir: str | Path) -> Path:
    """Round 2's completion marker, whichever way it combined the groups."""
    return storage_path(work_dir) / "completions" / "global"


def group_rows_path(work_dir: str | Path, gid: int) -> Path:
    """A group's rows as its select step scored them (ids, scores, probabilities): what the
    similarity cap and the central round read."""
    return storage_path(work_dir) / "groups" / f"{_group_name(gid)}.parquet"


def candidates_path(work_dir: str | Path, gid: int) -> Path:
    """Round 1 of a global budget: the candidates one group proposes."""
    return storage_path(work_dir) / "candidates" / f"{_group_name(gid)}.parquet"


def want_path(work_dir: str | Path, gid: int) -> Path:
    """Where the driver records that a group must propose more candidates."""
    return storage_path(work_dir) / "candidates" / f"{_group_name(gid)}.want.json"


def graph_path(work_dir: str | Path, gid: int) -> Path:
    """A group's neighbour graph (``indices`` int32, ``sims`` float32, shape (n, K)), saved
    by its select step for the exchange round, which would otherwise build it again."""
    return storage_path(work_dir) / "graphs" / f"{_group_name(gid)}.npz"


def exchange_path(work_dir: str | Path, gid: int) -> Path:
    """A group's candidates as the exchange round re-ordered them."""
    return storage_path(work_dir) / "exchange" / f"{_group_name(gid)}.parquet"


def exchange_marker(work_dir: str | Path, gid: int) -> Path:
    """The exchange round's marker for one group (its knots), written last."""
    return storage_path(work_dir) / "exchange" / f"{_group_name(gid)}.json"


def offer_path(work_dir: str | Path, gid: int) -> Path:
    """A group's offers for a token budget's fill: its best unkept rows."""
    return storage_path(work_dir) / "tokens" / f"offer-{_group_name(gid)}.parquet"


def tokens_fill_marker(work_dir: str | Path) -> Path:
    """The token fill's marker."""
    return storage_path(work_dir) / "completions" / "tokens-fill"


# --- WORK: cover and keep lists -------------------------------------------------------------
def kept_rows_path(work_dir: str | Path, gid: int) -> Path:
    """A group's kept rows (id and unit embedding), what its neighbours' cover reads."""
    return storage_path(work_dir) / "cover" / f"kept-{_group_name(gid)}.parquet"


def kept_rows_marker(work_dir: str | Path, gid: int) -> Path:
    """The marker of :func:`kept_rows_path` (the group's centroid)."""
    return storage_path(work_dir) / "cover" / f"kept-{_group_name(gid)}.json"


def cover_marker(work_dir: str | Path, gid: int) -> Path:
    """The cover step's marker for one group."""
    return storage_path(work_dir) / "cover" / f"{_group_name(gid)}.json"


def keep_bucket_path(work_dir: str | Path, bucket: int, gid: int) -> Path:
    """Group ``gid``'s kept rows of the input shards of bucket ``bucket``."""
    return storage_path(work_dir) / "keep" / f"bucket={bucket:05d}" / f"part-{gid:05d}.parquet"


def keep_group_marker(work_dir: str | Path, gid: int) -> Path:
    """The keep-list step's marker for one group."""
    return storage_path(work_dir) / "keep" / "done" / f"part-{gid:05d}.json"


def keep_bucket_marker(work_dir: str | Path, bucket: int) -> Path:
    """The keep-list step's marker for one bucket of input shards."""
    return storage_path(work_dir) / "keep" / "done" / f"bucket-{bucket:05d}.json"
