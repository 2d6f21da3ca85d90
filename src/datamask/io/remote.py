"""Remote inputs and outputs for ``select``, ``evaluate``, ``bench`` and ``embed``: stage,
run, upload (:func:`staged_paths`; :func:`datamask.select` calls it, the CLI's other
commands through :mod:`datamask.cli.staging`).

These commands read their inputs many times (the learner revisits every row) and write
through :mod:`datamask.io.atomic` (``os.replace``, ``flock``). So a remote argument is
handled around the command, not inside it:

1. every path argument is resolved with :func:`datamask.io.fs.resolve` and every remote
   one is reached once (:func:`~datamask.io.fs.check_reachable`), so a bad URI, unknown
   scheme, missing bucket or missing credentials is one line before anything is written;
2. remote inputs are copied into ``$DATAMASK_CACHE/in/<hash of the URI>/`` (a file already
   there with the same size and modification time is reused, so a resumed run does not
   download again);
3. the command runs on local paths; a remote output is written under
   ``$DATAMASK_CACHE/out/<hash of the URI>/`` (so two runs on this host writing the same
   URI exclude each other through the usual lock, and a killed sharded ``select`` resumes
   from the same work dir);
4. on success every file of the output is uploaded, each through
   :meth:`~datamask.io.fs.Location.open_atomic` (temporary key, then copy), the file that
   marks completion last (``manifest.json`` of a folder, the selection parquet itself
   for one-file output). The local work dir ``_work/`` is not uploaded.

``datamask apply`` needs none of this: it streams its shards straight from and to the
filesystem (:mod:`datamask.applying.core`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from .atomic import atomic_write, upload_file
from .claim import claim_output
from .fs import Location, cache_dir, check_reachable, is_uri, resolve
from .keep import relative_names
from .listing import expand, glob_root

__all__ = ["overlaps", "staged_paths"]

#: Output arguments that name folders (the others name files unless they end with "/").
_FOLDERS = ("out_dir", "work_dir")

#: Names uploaded last: their presence says the rest is complete.
_COMMIT_LAST = ("manifest.json",)


def _key(uri: str) -> str:
    return hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _download(loc: Location, what: str, suffixes: tuple[str, ...]) -> str:
    """Copy a remote file, folder or glob into the cache; return the local equivalent."""
    root = cache_dir() / "in" / _key(loc.uri)
    info = loc.info()
    files = [loc] if info.type == pafs.FileType.File else expand(loc, what=what, suffixes=suffixes)
    single = info.type == pafs.FileType.File
    names = [loc.name] if single else relative_names(glob_root(loc), [f.path for f in files])
    for f, name in zip(files, names, strict=True):
        target = root / name
        remote = f.info()
        mtime = remote.mtime.timestamp() if remote.mtime is not None else None
        if (
            target.is_file()
            and target.stat().st_size == remote.size
            and (mtime is None or abs(target.stat().st_mtime - mtime) < 1e-3)
        ):
            continue  # already staged by an earlier (killed or finished) run
        with atomic_write(target) as tmp, open(tmp, "wb") as out, f.open_input_stream() as src:
            while block := src.read(1 << 22):
                out.write(block)
        if mtime is not None:
            os.utime(target, (mtime, mtime))
    if not single:  # files an earlier download staged that the URI no longer names
        wanted = {root / n for n in names}
        for p in [p for p in root.rglob("*") if p.is_file() and p not in wanted]:
            p.unlink()
    return str(root / names[0]) if single else str(root)


def _upload(local: Path, loc: Location) -> int:
    """Upload a staged output (a file and its siblings, or a folder); returns files sent."""
    if local.is_dir():
        base, dest = local, loc
    else:
        base, dest = local.parent, loc.parent
    files = [
        p
        for p in sorted(base.rglob("*"))
        if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(base).parts)
        and p.relative_to(base).parts[0] != "_work"
    ]

    def last(p: Path) -> tuple[bool, str]:
        return (p.name in _COMMIT_LAST or p == local, str(p))

    for p in sorted(files, key=last):
        upload_file(p, dest.join(p.relative_to(base).as_posix()))
    return len(files)


def overlaps(a: Location, b: Location) -> bool:
    """Whether one location is, or lies inside, the other (same scheme)."""
    if a.scheme != b.scheme:
        return False
    pa_, pb = a.path.rstrip("/") + "/", b.path.rstrip("/") + "/"
    return pa_.startswith(pb) or pb.startswith(pa_)


@contextmanager
def staged_paths(
    paths: Mapping[str, Any],
    *,
    inputs: Sequence[str],
    suffixes: tuple[str, ...] = ("",),
    folders: Sequence[str] = _FOLDERS,
) -> Iterator[dict[str, Any]]:
    """Local stand-ins for the remote paths of a command, around its body.

    ``paths`` maps each argument's name to a path, a URI or None; the names in ``inputs``
    are read, the others written (``folders`` name folders, the others files unless they
    end with "/"). Inputs are downloaded before the body (``suffixes``: the files a remote
    folder or glob holds), outputs uploaded after it, only when it succeeds. ``file://``
    URIs become plain local paths; local paths, None and lists pass unchanged. Yields the
    same names with local paths.

    Raises
    ------
    ValueError
        A bad URI, unknown scheme, unreachable bucket, an output overlapping an input or
        claimed by another run (:mod:`datamask.io.claim`), before anything is read or
        written.
    """
    local: dict[str, Any] = dict(paths)
    remote: dict[str, Location] = {}
    for name, value in paths.items():
        if not isinstance(value, str | Path) or not is_uri(str(value)):
            continue
        loc = resolve(value, what=_flag(name))
        if loc.is_local:
            local[name] = loc.path
            continue
        check_reachable(loc, what=_flag(name))
        remote[name] = loc
    if not remote:
        yield local
        return
    outputs = [name for name in paths if name not in inputs]
    for o in outputs:
        for i in inputs:
            if o in remote and i in remote and overlaps(remote[o], remote[i]):
                raise ValueError(
                    f"{_flag(o)} {remote[o].uri!r} overlaps {_flag(i)} {remote[i].uri!r}; "
                    "writing it would overwrite or hide the input. Choose another output."
                )
    staged: list[tuple[Path, Location]] = []
    with ExitStack() as claims:  # one run per remote output, from any host (io/claim.py)
        for name in outputs:
            if name in remote:
                folder = name in folders or remote[name].uri.endswith("/")
                claims.enter_context(claim_output(remote[name], folder=folder))
                target = cache_dir() / "out" / _key(remote[name].uri) / remote[name].name
                staged.append((target, remote[name]))
                local[name] = str(target)
        for name in inputs:
            if name in remote:
                local[name] = _download(remote[name], _flag(name), suffixes)
        yield local
        for target, loc in staged:
            if target.exists():
                _upload(target, loc)
