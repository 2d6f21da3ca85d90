"""Remote inputs and outputs for ``select``, ``evaluate`` and ``embed``: stage, run, upload.

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
filesystem (:mod:`datamask.apply.core`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from .atomic import atomic_write
from .fs import Location, cache_dir, check_reachable, expand, glob_root, is_uri, resolve
from .keep import relative_names

__all__ = ["COMMAND_PATHS", "staged_arguments"]

#: Path arguments of each command: (inputs, outputs). ``select`` inputs are parquet shards.
COMMAND_PATHS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "select": (("input",), ("output", "work_dir")),
    "evaluate": (("input", "selection"), ("output",)),
    "embed": (("input",), ("output",)),
    "bench": (("input",), ("out_dir",)),
}

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
        base, dest = local.parent, loc.parent()
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
        target = dest.join(p.relative_to(base).as_posix())
        with target.open_atomic() as out, open(p, "rb") as src:
            while block := src.read(1 << 22):
                out.write(block)
    return len(files)


def _overlap(a: Location, b: Location) -> bool:
    if a.scheme != b.scheme:
        return False
    pa_, pb = a.path.rstrip("/") + "/", b.path.rstrip("/") + "/"
    return pa_.startswith(pb) or pb.startswith(pa_)


@contextmanager
def staged_arguments(
    args: Any, load_config: Callable[[str], dict[str, Any]] | None = None
) -> Iterator[Any]:
    """Rewrite remote path arguments of ``args`` to local ones around a command.

    Inputs are downloaded before the body, outputs uploaded after it (only when it
    succeeds). ``file://`` URIs become plain local paths. Commands not in
    :data:`COMMAND_PATHS` pass through unchanged. ``load_config`` reads ``args.config``
    (``select``'s settings file), whose paths are staged too.

    Raises
    ------
    ValueError
        A bad URI, unknown scheme, unreachable bucket or an output overlapping an input,
        before anything is read or written.
    """
    spec = COMMAND_PATHS.get(getattr(args, "command", ""))
    if spec is None:
        yield args
        return
    inputs, outputs = spec
    if load_config is not None and getattr(args, "config", None):
        # Paths may come from the config file: take them now (flags still win), so that a
        # remote one is staged like a flag's. The select command re-reads the file.
        config = load_config(args.config)
        for name in inputs + outputs:
            if getattr(args, name, None) is None and config.get(name) is not None:
                setattr(args, name, str(config[name]))
    if (
        args.command == "evaluate"
        and getattr(args, "output", None) is None
        and is_uri(str(args.selection))
    ):
        text = str(args.selection)
        stem = text.rsplit(".", 1)[0] if "." in text.rsplit("/", 1)[-1] else text
        args.output = stem + ".eval.json"  # beside the selection, as for a local one
    remote: dict[str, Location] = {}
    for name in inputs + outputs:
        value = getattr(args, name, None)
        if value is None or not is_uri(str(value)):
            continue
        loc = resolve(value, what=_flag(name))
        if loc.is_local:
            setattr(args, name, loc.path)
            continue
        check_reachable(loc, what=_flag(name))
        remote[name] = loc
    if not remote:
        yield args
        return
    for o in outputs:
        for i in inputs:
            if o in remote and i in remote and _overlap(remote[o], remote[i]):
                raise ValueError(
                    f"{_flag(o)} {remote[o].uri!r} overlaps {_flag(i)} {remote[i].uri!r}; "
                    "writing it would overwrite or hide the input. Choose another output."
                )
    staged: list[tuple[Path, Location]] = []
    for name in outputs:
        if name in remote:
            local = cache_dir() / "out" / _key(remote[name].uri) / remote[name].name
            staged.append((local, remote[name]))
            setattr(args, name, str(local))
    for name in inputs:
        if name in remote:
            suffixes = (".parquet",) if args.command == "select" else ("",)
            setattr(args, name, _download(remote[name], _flag(name), suffixes))
    yield args
    for local, loc in staged:
        if local.exists():
            _upload(local, loc)
