"""Where a sharded run keeps its files: :class:`WorkDir`, one method per path, read by
every step that writes or reads it. ``NNNNN`` is a group id (or a bucket, a shard, a
part), five digits.

``WORK`` (``OUT/_work`` unless ``--work-dir``), in the order the phases write it::

    settings.json                       the settings and input fingerprint (the claim)
    ids/                                check: id hashes by bucket, done/bucket=NNNNN.json
    clusters/kmeans/                    plan: the sample's parts (:mod:`.plan.kmeans`)
    clusters/tree.npz                   plan: the cluster tree
    clusters/shard-NNNNN.{parquet,json} plan: a shard's rows sorted by leaf (its spill)
    clusters/offsets.*                  plan: every spill's rows per leaf, in one table
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
``covered/part-NNNNN.parquet``, ``keep/`` (the keep lists ``apply`` reads),
``manifest.json``.

A :class:`WorkDir` holds the two places as text (what travels to the steps in their jobs)
and answers a ``Path`` for a local place and a :class:`~datamask.io.fs.Location` for a
remote one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..io.fs import Location, storage_path
from ..io.keep import keep_dir_for

__all__ = ["GLOBAL_PART", "Place", "WorkDir"]

#: The selected part of a run whose groups were combined by one central round.
GLOBAL_PART = "part-global.parquet"

#: A local path or a remote object (what every :class:`WorkDir` method answers).
Place = Path | Location


#: A spill marker's name around its shard's number: ``shard-00042.json``.
SPILL_MARKER = ("shard-", ".json")


def _n(number: int) -> str:
    return f"{number:05d}"


@dataclass(frozen=True, slots=True)
class WorkDir:
    """The output folder ``out`` and the work dir ``work`` of one sharded run, and every
    path in them.

    Examples
    --------
    >>> dirs = WorkDir.of("/data/out")
    >>> str(dirs.candidates(7))
    '/data/out/_work/candidates/00007.parquet'
    >>> str(dirs.part(7))
    '/data/out/selected/part-00007.parquet'
    """

    out: str
    work: str

    @classmethod
    def of(cls, output: str | Place, work_dir: str | Place | None = None) -> WorkDir:
        """The places of a run writing ``output`` (default work dir: ``output/_work``)."""
        out = storage_path(output)
        work = storage_path(work_dir) if work_dir is not None else out / "_work"
        return cls(str(out), str(work))

    # --- OUT ------------------------------------------------------------------------------
    @property
    def output(self) -> Place:
        """The output folder."""
        return storage_path(self.out)

    def manifest(self) -> Place:
        """The run's manifest (``OUT/manifest.json``)."""
        return self.output / "manifest.json"

    def selected(self) -> Place:
        """The output dataset of selected ids."""
        return self.output / "selected"

    def part(self, gid: int) -> Place:
        """The selected-ids file of one group in the output dataset."""
        return self.selected() / f"part-{_n(gid)}.parquet"

    def global_part(self) -> Place:
        """The selected-ids file of the central round (every group's rows in one part)."""
        return self.selected() / GLOBAL_PART

    def keep_lists(self) -> str:
        """The keep lists ``apply`` reads (``OUT/keep``: :func:`~datamask.io.keep.keep_dir_for`,
        the layout one-file selections share)."""
        return keep_dir_for(self.out, folder=True)

    def covered(self) -> Place:
        """The cover dataset (``OUT/covered``)."""
        return self.output / "covered"

    def cover_part(self, gid: int) -> Place:
        """One group's part of the cover dataset."""
        return self.covered() / f"part-{_n(gid)}.parquet"

    # --- WORK: the claim, check and plan --------------------------------------------------
    @property
    def root(self) -> Place:
        """The work dir."""
        return storage_path(self.work)

    def settings(self) -> Place:
        """The settings and input fingerprint a run claims the work dir with."""
        return self.root / "settings.json"

    def id_buckets(self) -> Place:
        """Where the scan steps file the id hashes (``WORK/ids``)."""
        return self.root / "ids"

    def id_bucket(self, bucket: int, shard: int) -> Place:
        """One shard's id hashes of one bucket."""
        return self.id_buckets() / f"bucket={_n(bucket)}" / f"shard-{_n(shard)}.parquet"

    def bucket_marker(self, bucket: int) -> Place:
        """What a bucket step found, written once it has looked at every shard's file."""
        return self.id_buckets() / "done" / f"bucket={_n(bucket)}.json"

    def clusters(self) -> Place:
        """The cluster partition's files: the k-means sample and tree, the spills, the
        groups."""
        return self.root / "clusters"

    def kmeans(self) -> Place:
        """The k-means fit's sample parts and partial sums (:mod:`.plan.kmeans`)."""
        return self.clusters() / "kmeans"

    def kmeans_rows(self, kind: str, part: int) -> Place:
        """A part of the k-means sample as float32 rows: ``part`` as sampled, ``routed``
        sorted by cluster (:mod:`.plan.kmeans`)."""
        return self.kmeans() / f"{kind}-{_n(part)}.f32"

    def kmeans_marker(self, kind: str, number: int) -> Place:
        """The marker of a k-means step: ``part``, ``routed`` (a part) or ``subtrees`` (a
        batch of clusters)."""
        return self.kmeans() / f"{kind}-{_n(number)}.json"

    def subtrees(self, batch: int) -> Place:
        """The subtrees one batch of clusters grew (:class:`~.plan.kmeans.FitSubtrees`)."""
        return self.kmeans() / f"subtrees-{_n(batch)}.npz"

    def tree(self) -> Place:
        """The cluster tree (:class:`~.plan.tree.ClusterTree`)."""
        return self.clusters() / "tree.npz"

    def spill(self, shard: int) -> Place:
        """The spill of one shard: its rows sorted by leaf (``partition.spill_shard``)."""
        return self.clusters() / f"shard-{_n(shard)}.parquet"

    def spill_marker(self, shard: int) -> Place:
        """A spill's marker: its rows per leaf (what the index step reads)."""
        return self.clusters() / f"{SPILL_MARKER[0]}{_n(shard)}{SPILL_MARKER[1]}"

    @staticmethod
    def spilled_shard(name: str) -> int | None:
        """The shard whose :meth:`spill_marker` is named ``name``; None for other names."""
        head, tail = SPILL_MARKER
        number = name[len(head) : -len(tail)]
        ok = name.startswith(head) and name.endswith(tail) and number.isascii() and number.isdigit()
        return int(number) if ok else None

    def spill_index(self, kind: str) -> Place:
        """The index of the spills: ``bin`` (every spill's rows per leaf), ``json`` (its
        marker), ``spills.json`` (the spills it indexed)."""
        return self.clusters() / f"offsets.{kind}"

    def spills_released(self) -> Place:
        """The marker that every group is gathered and the spills deleted
        (``gather.release_spills``): a spill's counts alone then mark it done."""
        return self.clusters() / "spills-released.json"

    def group_objects(self) -> Place:
        """The folder of the group objects and their markers."""
        return self.clusters() / "groups"

    def group_object(self, gid: int) -> Place:
        """The one object a cluster group's steps read."""
        return self.group_objects() / f"group-{_n(gid)}.parquet"

    def group_object_marker(self, gid: int) -> Place:
        """The gather step's marker for one group object."""
        return self.group_objects() / f"group-{_n(gid)}.json"

    def given_kept(self) -> Place:
        """KEPT's kept rows: id and unit embedding, what every group's floor is taken
        against."""
        return self.root / "given" / "kept.parquet"

    def given_marker(self) -> Place:
        """The marker of KEPT's rows, written once :meth:`given_kept` is."""
        return self.root / "completions" / "given"

    # --- WORK: select, allocate, exchange -------------------------------------------------
    def completions(self) -> Place:
        """The folder of the groups' and round 2's completion markers."""
        return self.root / "completions"

    def completion(self, gid: int) -> Place:
        """The marker a finished group leaves behind."""
        return self.completions() / _n(gid)

    def global_marker(self) -> Place:
        """Round 2's completion marker, whichever way it combined the groups."""
        return self.completions() / "global"

    def group_rows(self, gid: int) -> Place:
        """A group's rows as its select step scored them (ids, scores, probabilities): what
        the similarity cap and the central round read."""
        return self.root / "groups" / f"{_n(gid)}.parquet"

    def proposals(self) -> Place:
        """The folder of the groups' candidates and of the driver's requests for more."""
        return self.root / "candidates"

    def candidates(self, gid: int) -> Place:
        """Round 1 of a global budget: the candidates one group proposes."""
        return self.proposals() / f"{_n(gid)}.parquet"

    def want(self, gid: int) -> Place:
        """Where the driver records that a group must propose more candidates."""
        return self.proposals() / f"{_n(gid)}.want.json"

    def graph(self, gid: int) -> Place:
        """A group's neighbour graph (``indices`` int32, ``sims`` float32, shape (n, K)),
        saved by its select step for the exchange round, which would otherwise build it
        again."""
        return self.root / "graphs" / f"{_n(gid)}.npz"

    def exchange(self, gid: int) -> Place:
        """A group's candidates as the exchange round re-ordered them."""
        return self.root / "exchange" / f"{_n(gid)}.parquet"

    def exchange_marker(self, gid: int) -> Place:
        """The exchange round's marker for one group (its knots), written last."""
        return self.root / "exchange" / f"{_n(gid)}.json"

    def offer(self, gid: int) -> Place:
        """A group's offers for a token budget's fill: its best unkept rows."""
        return self.root / "tokens" / f"offer-{_n(gid)}.parquet"

    def tokens_fill_marker(self) -> Place:
        """The token fill's marker."""
        return self.root / "completions" / "tokens-fill"

    # --- WORK: cover and keep lists -------------------------------------------------------
    def kept_rows(self, gid: int) -> Place:
        """A group's kept rows (id and unit embedding), what its neighbours' cover reads."""
        return self.root / "cover" / f"kept-{_n(gid)}.parquet"

    def kept_rows_marker(self, gid: int) -> Place:
        """The marker of :meth:`kept_rows` (the group's centroid)."""
        return self.root / "cover" / f"kept-{_n(gid)}.json"

    def cover_marker(self, gid: int) -> Place:
        """The cover step's marker for one group."""
        return self.root / "cover" / f"{_n(gid)}.json"

    def keep_buckets(self, bucket: int) -> Place:
        """The folder of every group's kept rows of the input shards of bucket ``bucket``."""
        return self.root / "keep" / f"bucket={_n(bucket)}"

    def keep_bucket(self, bucket: int, gid: int) -> Place:
        """Group ``gid``'s kept rows of the input shards of bucket ``bucket``."""
        return self.keep_buckets(bucket) / f"part-{_n(gid)}.parquet"

    def keep_group_marker(self, gid: int) -> Place:
        """The keep-list step's marker for one group."""
        return self.root / "keep" / "done" / f"part-{_n(gid)}.json"

    def keep_bucket_marker(self, bucket: int) -> Place:
        """The keep-list step's marker for one bucket of input shards."""
        return self.root / "keep" / "done" / f"bucket-{_n(bucket)}.json"
