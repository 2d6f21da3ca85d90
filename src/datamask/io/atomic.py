"""Atomic writes, stale-temporary clean-up and the exclusive claim on an output.

Every file datamask writes goes through :func:`atomic_write`: the bytes land in a hidden
temporary beside the target, ``.<name>.<host>.<pid>.<random>.tmp``, are flushed to disk,
and one ``os.replace`` puts them in place (:func:`atomic_write_group` does the same for
several files published as one unit; remote outputs use the same temporary names, see
:meth:`datamask.io.fs.Location.open_atomic`). So

- a crash, a ``kill -9`` or a full disk leaves either the old file or the new one, never
  half a file (and the leading dot keeps pyarrow's dataset discovery from seeing it);
- two processes writing the same target never share a temporary (host, pid and a random
  token are in its name);
- a temporary left by a killed run is *provably* stale: its name says which host and pid
  wrote it, and that pid is no longer alive. :func:`clean_stale_temporaries` removes only
  those, and every atomic write calls it for its own target.

:class:`OutputLock` is the claim on an output: an exclusive, non-blocking ``flock`` on
``.<name>.lock`` beside it (released by the kernel if the process dies, so a ``kill -9``
never leaves a lock that blocks the next run). A second ``datamask`` writing the same
output is refused at the door with the pid and host holding it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import numpy as np

from .integrity import file_record, published
from .retry import retrying

__all__ = [
    "DIRECT_PUT_MAX",
    "OutputLock",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_group",
    "atomic_write_json",
    "atomic_write_text",
    "check_no_overlap",
    "check_writable",
    "clean_stale_temporaries",
    "describe_os_error",
    "is_temporary",
    "temporary_name",
    "upload_file",
]

_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


#: The largest remote object written in one request (:meth:`~datamask.io.fs.Location.put`):
#: under the 5 MiB part of pyarrow's S3 stream, which then sends nothing before its close.
DIRECT_PUT_MAX = 5 * 1024 * 1024 - 1


#: Bytes of a file name a temporary adds (host, pid, token); a longer target name is cut
#: and tagged with its digest so the temporary stays a legal name (255 bytes).
_TMP_NAME_MAX = 255 - (len(_HOST) + 32)


def _tmp_key(name: str) -> str:
    """The part of a temporary's name that stands for the target ``name``."""
    if len(name.encode()) <= _TMP_NAME_MAX:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    head = name.encode()[: _TMP_NAME_MAX - 17].decode(errors="ignore")
    return f"{head}~{digest}"


def temporary_name(path: str | Path) -> Path:
    """A fresh hidden temporary beside ``path``, unique to this host, process and call."""
    path = Path(path)
    key = _tmp_key(path.name)
    return path.with_name(f".{key}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def is_temporary(filename: str, name: str | None = None) -> bool:
    """True when ``filename`` is a :func:`temporary_name` (of the target ``name``, if given)."""
    m = _TMP_RE.match(filename)
    return m is not None and (name is None or m["name"] == _tmp_key(name))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def clean_stale_temporaries(folder: str | Path, name: str | None = None) -> list[Path]:
    """Remove temporaries of dead datamask processes of this host in ``folder``.

    Only names made by :func:`temporary_name` are considered (optionally only those of the
    target ``name``), and only when they were written on this host by a process that no
    longer exists: a live writer's temporary, another host's or anything else is left alone.

    Returns
    -------
    list of Path
        The files removed.
    """
    if _is_remote(folder):  # object storage: no pid to test; see _remote_write
        return []
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if not m or m["host"] != _HOST or (name is not None and m["name"] != _tmp_key(name)):
            continue
        if int(m["pid"]) == os.getpid() or _pid_alive(int(m["pid"])):
            continue
        try:
            entry.unlink()
            removed.append(entry)
        except OSError:
            pass
    return removed


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _record(target: Any, tmp: Path, record: dict[str, Any] | None) -> None:
    """What a write publishes, for ``record`` and for an open
    :func:`~datamask.io.integrity.recording` (a step's marker): read once, if either asks."""
    book = published(target, tmp)
    if record is not None:
        record.update(book if book is not None else file_record(tmp))


def _commit(tmp: Path, path: Path) -> None:
    """Move a synced temporary over its target: the one rename of every local write."""
    os.replace(tmp, path)


@contextmanager
def atomic_write(
    path: str | Path | Any, *, commit: bool = True, record: dict[str, Any] | None = None
) -> Iterator[Path]:
    """Yield a temporary path to write; on success move it over ``path`` in one rename.

    ``path`` may also be a remote :class:`datamask.io.fs.Location`: the temporary is then
    a local file uploaded on success (:func:`_remote_write`).

    Parameters
    ----------
    path : str or Path
        The target. Its folder is created when missing.
    commit : bool, default=True
        With ``False`` the temporary is synced but not renamed (see
        :func:`atomic_write_group`); it is still removed if the ``with`` body raises.
    record : dict, optional
        Filled with the ``size`` and ``blake2b`` checksum of the bytes published
        (:func:`datamask.io.integrity.file_record`, taken from the temporary), for a
        marker to keep and a reader to check (:func:`datamask.io.verify.check_object`).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> with atomic_write(target) as tmp:
    ...     _ = tmp.write_text("hello")
    >>> target.read_text()
    'hello'
    """
    if isinstance(path, str) and _URI_RE.match(path):  # never a local folder named "s3:"
        raise TypeError(
            f"atomic_write takes a path or a datamask.io.fs.Location, not the URI {path!r}; "
            "use datamask.io.fs.storage_path."
        )
    if _is_remote(path):
        with _remote_write(path, commit=commit) as tmp:
            yield tmp
            _record(path, tmp, record)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(path.parent, path.name)
    tmp = temporary_name(path)
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            _record(path, tmp, record)
        if commit:
            _commit(tmp, path)
            _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _is_remote(path: Any) -> bool:
    """A :class:`datamask.io.fs.Location` on object storage (not imported: fs imports this)."""
    return getattr(path, "is_local", True) is False


@contextmanager
def _remote_write(target: Any, *, commit: bool) -> Iterator[Path]:
    """:func:`atomic_write` of an object: the body writes a local file in this process's
    temporary folder (``$TMPDIR``: the worker's own disk, never the driver's), which is then
    streamed to a hidden temporary key and moved onto ``target`` (a server-side copy,
    atomic per object: :meth:`~datamask.io.fs.Location.open_atomic`). A killed writer leaves
    at most a hidden temporary key, which readers skip."""
    if not commit:
        raise ValueError(
            f"a group of files cannot be published as one unit on object storage ({target})."
        )
    folder = Path(tempfile.mkdtemp(prefix="datamask-put-"))
    try:
        tmp = folder / target.name
        yield tmp
        upload_file(tmp, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def upload_file(local: str | Path, target: Any) -> None:
    """Upload the local file ``local`` onto the remote location ``target`` atomically,
    the whole upload (to a fresh temporary key, then the copy onto ``target``; a small S3
    object in one ``PutObject``, :meth:`~datamask.io.fs.Location.put`) retried on
    transient faults (:func:`datamask.io.retry.retrying`)."""

    if target.puts_whole(os.path.getsize(local)):  # one PutObject, no temporary key
        target.put(Path(local).read_bytes())
        return

    def once() -> None:
        with target.open_atomic() as out, open(local, "rb") as src:
            while block := src.read(1 << 22):
                out.write(block)

    retrying(once, f"writing {target.uri!r}")


@contextmanager
def atomic_write_group(paths: Sequence[str | Path]) -> Iterator[list[Path]]:
    """Yield one temporary per target; on success publish them all as one unit.

    Every temporary is written and synced before any target changes. Then the *other*
    targets (all but the first) are removed, and the temporaries renamed over their
    targets in order, the first one first. The first file is the authoritative one: a
    crash or full disk at any point leaves either the old set, or the new first file with
    some of its companions missing, never a new first file next to an old companion.
    If the ``with`` body raises, no target is touched and the temporaries are removed.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_write_group([folder / "a.txt", folder / "a.json"]) as (t1, t2):
    ...     _ = t1.write_text("rows")
    ...     _ = t2.write_text("{}")
    >>> sorted(p.name for p in folder.iterdir())
    ['a.json', 'a.txt']
    """
    targets = [Path(p) for p in paths]
    with ExitStack() as stack:
        tmps = [stack.enter_context(atomic_write(p, commit=False)) for p in targets]
        yield tmps
    try:
        with signals_deferred():  # Ctrl-C or SIGTERM acts once every target is in place
            for path in targets[1:]:
                path.unlink(missing_ok=True)
            for tmp, path in zip(tmps, targets, strict=True):
                _commit(tmp, path)
            for folder in dict.fromkeys(p.parent for p in targets):
                _fsync_dir(folder)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the body (a commit of several renames), then act
    on the first that came. Only the main thread can; elsewhere the body just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: got.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if got:
            signal.raise_signal(got[0])


def _write_with(path: str | Path, mode: str, body: Callable[[IO[Any]], None]) -> None:
    text = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}  # bytes as written
    with atomic_write(path) as tmp, open(tmp, mode, **text) as fh:
        body(fh)


def atomic_write_bytes(data: bytes, path: str | Path) -> None:
    """Write ``data`` to ``path`` atomically."""
    _write_with(path, "wb", lambda fh: fh.write(data))


def atomic_write_text(text: str, path: str | Path) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(text.encode("utf-8"), path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def to_json(obj: Any) -> str:
    """``obj`` as indented JSON (numpy scalars/arrays and paths allowed)."""
    return json.dumps(obj, indent=2, default=_jsonable) + "\n"


def atomic_write_json(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically: :func:`to_json`'s bytes,
    streamed (``json.dumps`` with an indent first lists every piece of the text, tens of
    bytes each, and holds them all: several KB per group of a sharded run's manifest)."""

    def body(fh: IO[Any]) -> None:
        json.dump(obj, fh, indent=2, default=_jsonable)
        fh.write("\n")

    _write_with(path, "w", body)


# --- claims on outputs ------------------------------------------------------------------------
def describe_os_error(exc: OSError, path: str | Path) -> str:
    """One line for an OS error on ``path`` (read-only file system, full disk, ...)."""
    reason = exc.strerror or str(exc)
    return f"cannot write {str(path)!r}: {reason}."


class OutputLock:
    """An exclusive, non-blocking claim on an output path, held until :meth:`release`.

    The lock is ``flock`` on ``.<name>.lock`` beside ``path`` (inside it when ``path`` is a
    folder output). A process killed while holding it releases it with its last file
    descriptor, so no stale lock ever blocks a later run; the file itself is removed on
    release.

    Parameters
    ----------
    path : str or Path
        The output to claim.
    folder : bool, default=False
        ``path`` is a folder output (the lock lives inside it).

    Raises
    ------
    ValueError
        When another live process holds the claim (its pid and host are named), or the
        lock cannot be created (read-only file system, a file where a folder should be...).
    """

    def __init__(self, path: str | Path, *, folder: bool = False) -> None:
        self.path = Path(path)
        where = self.path if folder else self.path.parent
        self.lock_path = where / (".datamask.lock" if folder else f".{self.path.name}.lock")
        self._fd: int | None = None
        self._created: list[Path] = []
        self._acquire(where)

    def _acquire(self, where: Path) -> None:
        missing = []
        probe = where
        while not probe.exists():
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise ValueError(
                f"cannot write {str(self.path)!r}: {str(probe)!r} is a file, not a folder."
            )
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(describe_os_error(exc, self.path)) from None
        self._created = list(reversed(missing))
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self._remove_created()
                raise ValueError(describe_os_error(exc, self.path)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = self._holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    self._remove_created()
                    raise ValueError(
                        f"{str(self.path)!r} is being written by another datamask run "
                        f"({holder}); wait for it to finish or choose another output."
                    ) from None
                self._remove_created()
                raise ValueError(describe_os_error(exc, self.path)) from None
            # The holder before us may have unlinked the file after we opened it: then we
            # locked an orphan inode and must retry on the file now at the path.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        except OSError as exc:
            os.close(fd)
            self._remove_created()
            raise ValueError(describe_os_error(exc, self.path)) from None
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        return text or "pid unknown"

    def _remove_created(self) -> None:
        """Remove the folders this claim created, when they are still empty."""
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []

    def release(self, *, remove_created: bool = False) -> None:
        """Drop the claim. With ``remove_created``, also remove folders it made if empty."""
        if self._fd is None:
            return
        with suppress(OSError):
            self.lock_path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
        if remove_created:
            self._remove_created()

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.release(remove_created=exc_type is not None)


def check_no_overlap(
    outputs: Sequence[str | Path], inputs: Sequence[str | Path], *, what: str = "--output"
) -> None:
    """Refuse an output that is, contains or lies inside an input (paths resolved).

    ``inputs`` may be files or folders; an output folder that holds an input file, or an
    output equal to an input, would overwrite or hide it.
    """
    for out in outputs:
        o = _place_key(out)
        for inp in inputs:
            i = _place_key(inp)
            if o == i:
                raise ValueError(
                    f"{what} {str(out)!r} is the input {str(inp)!r}; writing it would "
                    "destroy the input. Choose another output path."
                )
            if i.startswith(o.rstrip("/") + "/"):
                raise ValueError(
                    f"{what} {str(out)!r} contains the input {str(inp)!r}; choose an output "
                    "outside the input."
                )


_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _place_key(place: Any) -> str:
    """A path or URI as comparable text: local paths resolved, URIs as written."""
    if _is_remote(place) or _URI_RE.match(str(place)):
        return str(place).rstrip("/")
    return str(Path(place).resolve())


def check_writable(path: str | Path, *, folder: bool = False) -> None:
    """Refuse an output that cannot be written, before any computation.

    A file output must not be an existing folder and its parent must not be a file; a
    folder output must not be a file. (Permissions and read-only file systems are found by
    :class:`OutputLock`, which creates a file beside the output.)
    """
    p = Path(path)
    if folder:
        if p.exists() and not p.is_dir():
            raise ValueError(f"output {str(p)!r} is a file; this command writes a folder.")
    elif p.is_dir():
        raise ValueError(f"output {str(p)!r} is an existing folder; give a file path.")
    probe = p.parent if not folder else p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"cannot write {str(p)!r}: {str(probe)!r} is a file, not a folder.")
