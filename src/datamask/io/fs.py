"""One storage layer for every input and output: local paths, ``file://``, ``s3://``, ``gs://``, ``hf://``.

:func:`resolve` turns what a user typed into a :class:`Location` (a ``pyarrow.fs``
filesystem and a path in it) or refuses it with one line, before anything is read or
written: an unknown scheme, a malformed URI (``s3:/bucket``), an empty bucket name, a
missing optional package. :func:`check_reachable` then makes one cheap request (the
bucket's or object's metadata), so missing credentials, an unknown endpoint or a missing
bucket are also refused at the door.

Filesystems:

- local paths and ``file:///abs/path``: ``pyarrow.fs.LocalFileSystem``;
- ``s3://bucket/key``: ``pyarrow.fs.S3FileSystem``, configured by the usual AWS variables
  (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or ``AWS_PROFILE``, ``AWS_REGION``,
  ``AWS_ENDPOINT_URL`` for MinIO, moto or another S3 API);
- ``gs://bucket/key``: ``pyarrow.fs.GcsFileSystem`` (Google default credentials;
  ``STORAGE_EMULATOR_HOST=http://host:port``, as Google's clients read it, for an emulator,
  unsigned);
- ``hf://datasets/org/name/path``: ``huggingface_hub.HfFileSystem`` (fsspec) wrapped in
  ``pyarrow.fs.PyFileSystem``; ``HF_TOKEN`` for private repositories.

Atomic writes (:meth:`Location.open_atomic`): locally, :func:`datamask.io.atomic.atomic_write`
(hidden temporary, ``fsync``, ``os.replace``). On object storage a PUT (or a completed
multipart upload) is atomic per object, but an interrupted Python ``with`` block would
still *complete* the upload of a half-written stream; so the bytes go to a hidden
temporary key ``.<name>.<host>.<pid>.<token>.tmp`` beside the target, which is then
copied onto the final key (S3 ``CopyObject``, atomic per object) and deleted. The final
key therefore only ever holds a complete object; a killed run leaves at most a hidden
temporary, which readers skip and the next run removes. An S3 object whose bytes are
held whole in memory and under :data:`~datamask.io.atomic.DIRECT_PUT_MAX` (a marker, a
group's small tables) is written by :meth:`Location.put` instead: the stream only buffers
them, and its close sends one ``PutObject`` (``allow_delayed_open``), so there is no
half-written stream to complete: one request where the temporary key takes three.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from .atomic import DIRECT_PUT_MAX, atomic_write, is_temporary, temporary_name
from .filesystems import (
    PROBE_ATTEMPTS,
    STORAGE_ENV,
    _anonymous_s3,
    _gcs,
    _hf,
    _s3_from_env,
    _s3_retries,
    storage_env,
)
from .retry import RetryingFile, StorageUnavailable, is_transient, retrying, unavailable

__all__ = [
    "REMOTE_SCHEMES",
    "STORAGE_ENV",
    "Location",
    "names_in",
    "sizes_in",
    "open_input",
    "open_whole",
    "resolve",
    "storage_env",
    "storage_path",
    "is_uri",
    "check_reachable",
    "cache_dir",
    "expect_file",
    "folder_kind",
]

#: Schemes datamask reads and writes (``gcs`` is an alias of ``gs``).
REMOTE_SCHEMES = ("s3", "gs", "gcs", "hf")
_SCHEMES = ("file", *REMOTE_SCHEMES)
_URI_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<slashes>/*)(?P<rest>.*)$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]$")


def is_uri(text: str) -> bool:
    """Whether ``text`` starts with a scheme (``s3:``, ``file:``, ``foo:/``...)."""
    m = _URI_RE.match(str(text))
    # "C:/x" style drive letters do not exist on the platforms datamask runs on; a bare
    # "name:thing" with no slash is a local file name.
    return bool(m and m["slashes"])


def folder_kind(loc: Location) -> str:
    """What a folder is, as a message names it: a sharded ``datamask select`` output (its
    ``manifest.json`` or ``selected/``), the keep lists of one (``<stem>.keep/`` or
    ``OUT/keep/``, holding ``_index.json``), a ``datamask apply`` output; else ``""``."""
    if loc.join("manifest.json").is_file() or loc.join("selected").is_dir():
        return (
            "a sharded `datamask select` output; its manifest.json holds the run's terms, "
            "for facility location its J over every document"
        )
    if loc.join("_index.json").is_file() or loc.path.rstrip("/").endswith((".keep", "/keep")):
        stem = loc.uri.rstrip("/").removesuffix(".keep")
        own = (
            f"; its selection file is {stem}.parquet"
            if loc.uri.rstrip("/").endswith(".keep")
            else ""
        )
        return f"the keep lists of a `datamask select` output{own}"
    if loc.join("_datamask_apply").is_dir():
        return "a `datamask apply` output"
    return ""


def expect_file(path: str | Path | Location, *, what: str, accepted: str) -> Location:
    """The one check of a file argument: ``path`` names a file (local or remote).

    A folder is named a folder, with what it is (:func:`folder_kind`) and what ``what``
    accepts; never said not to exist.

    Raises
    ------
    ValueError
        ``path`` is a folder, or does not exist.
    """
    loc = path if isinstance(path, Location) else resolve(str(path), what=what)
    kind = loc.info().type
    if kind == pafs.FileType.Directory:
        found = folder_kind(loc)
        raise ValueError(
            f"{what} {loc.uri!r} is a folder, not a file"
            + (f" ({found})" if found else "")
            + f"; give {accepted}."
        )
    if kind == pafs.FileType.NotFound:
        raise ValueError(f"{what} {loc.uri!r} does not exist.")
    return loc


def cache_dir() -> Path:
    """Local folder for staged remote files and remote-output claims.

    ``$DATAMASK_CACHE`` when set, else ``~/.cache/datamask``.
    """
    env = os.environ.get("DATAMASK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "datamask"


@dataclass(frozen=True)
class Location:
    """A path in a filesystem, with the text the user gave.

    Attributes
    ----------
    uri : str
        The location as written by the user (or derived from it by :meth:`join`).
    scheme : str
        ``""`` for a local path, else ``"file"``, ``"s3"``, ``"gs"`` or ``"hf"``.
    fs : pyarrow.fs.FileSystem
        The filesystem.
    path : str
        The path inside ``fs`` (``bucket/key`` on object storage).
    """

    uri: str
    scheme: str
    fs: Any
    path: str

    @property
    def is_local(self) -> bool:
        return self.scheme in ("", "file")

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def join(self, *parts: str) -> Location:
        """A location below this one (``parts`` use ``/``)."""
        tail = "/".join(p.strip("/") for p in parts if p)
        path = f"{self.path.rstrip('/')}/{tail}" if tail else self.path
        uri = f"{self.uri.rstrip('/')}/{tail}" if tail else self.uri
        return Location(uri, self.scheme, self.fs, path)

    @property
    def parent(self) -> Location:
        path = self.path.rstrip("/").rsplit("/", 1)[0]
        uri = self.uri.rstrip("/").rsplit("/", 1)[0]
        return Location(uri, self.scheme, self.fs, path)

    def __str__(self) -> str:
        return self.uri

    # --- the few pathlib.Path methods a sharded run's steps use, so a work dir, output or
    # shard is a Path locally and a Location on object storage, with the same code ----------
    def __truediv__(self, part: str) -> Location:
        return self.join(str(part))

    def unlink(self, missing_ok: bool = True) -> None:
        """Remove the object (a missing one is fine, as ``Path.unlink(missing_ok=True)``)."""
        self.delete()

    def resolve(self) -> Location:
        return self

    def glob(self, pattern: str) -> list[Location]:
        """The files directly in this folder whose names match ``pattern`` (one listing)."""
        return [
            self / name for name in sorted(names_in(self)) if fnmatch.fnmatchcase(name, pattern)
        ]

    # --- reading ------------------------------------------------------------------------
    def _retry(self, call: Any, doing: str) -> Any:
        """``call()``, retried on transient faults when the location is remote."""
        return call() if self.is_local else retrying(call, f"{doing} {self.uri!r}")

    def info(self) -> pafs.FileInfo:
        try:
            return self._retry(lambda: self.fs.get_file_info(self.path), "reading")
        except StorageUnavailable:
            raise
        except OSError as exc:
            raise ValueError(f"cannot read {self.uri!r}: {_first_line(exc)}") from None

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def open_input_file(self) -> Any:
        """A random-access file (for parquet footers and row groups); on object storage a
        :class:`~datamask.io.retry.RetryingFile` (each read retried on transient faults)."""
        if self.is_local:
            return self.fs.open_input_file(self.path)
        return RetryingFile(lambda: self.fs.open_input_file(self.path), f"reading {self.uri!r}")

    def open_input_stream(self) -> Any:
        """A sequential stream (plain bytes: ``.gz`` is decompressed by the caller); on
        object storage one request for the object, reads retried as
        :meth:`open_input_file`'s."""
        if self.is_local:
            return self.fs.open_input_stream(self.path, compression=None)
        what = f"reading {self.uri!r}"
        first = retrying(lambda: self.fs.open_input_stream(self.path, compression=None), what)
        return RetryingFile(lambda: self.fs.open_input_file(self.path), what, first=first)

    def read_bytes(self) -> bytes:
        with self.open_input_stream() as fh:
            return fh.read()

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def walk(self) -> list[Location]:
        """Every file below this folder, sorted, skipping hidden (``.x``) and ``_x`` names."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        try:
            infos = self._retry(lambda: self.fs.get_file_info(selector), "listing")
        except StorageUnavailable:
            raise
        except OSError as exc:
            raise ValueError(f"cannot list {self.uri!r}: {_first_line(exc)}") from None
        root = self.path.rstrip("/") + "/"
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.startswith(root):
                continue
            rel = info.path[len(root) :]
            if any(part.startswith((".", "_")) for part in rel.split("/")):
                continue
            out.append(self.join(rel))
        return sorted(out, key=lambda loc: loc.path)

    # --- writing ------------------------------------------------------------------------
    @contextmanager
    def open_atomic(self) -> Iterator[Any]:
        """A writable binary stream whose bytes appear at this location only if the block ends.

        See the module docstring for how each filesystem makes this atomic.
        """
        if self.is_local:
            with atomic_write(self.path) as tmp, open(tmp, "wb") as fh:
                yield fh
            return
        tmp = self.parent.join(temporary_name(self.name).name)
        stream = tmp._retry(lambda: self.fs.open_output_stream(tmp.path), "writing")
        try:
            yield stream
            written = stream.tell()
            try:
                stream.close()  # the upload completes (the SDK retries its requests)
            except OSError as exc:
                # A completion the server did but whose answer was lost is retried by the
                # SDK and refused (NoSuchUpload): the temporary holding every byte says so.
                if not is_transient(exc) or tmp._size() != written:
                    raise
            # S3/GCS: server-side copy, then delete; both safe to repeat.
            self._retry(lambda: self.fs.move(tmp.path, self.path), "writing")
        except BaseException as exc:
            try:
                with suppress(OSError):
                    stream.close()  # completes the temporary object; removed just below
            finally:
                with suppress(OSError):
                    tmp.delete()
            if isinstance(exc, OSError) and is_transient(exc):
                raise unavailable(f"writing {self.uri!r}", exc, 1) from None
            raise

    def _size(self) -> int | None:
        """The object's size, None when missing or the store does not answer."""
        try:
            info = self._retry(lambda: self.fs.get_file_info(self.path), "reading")
        except OSError:
            return None
        return info.size if info.type == pafs.FileType.File else None

    def puts_whole(self, size: int) -> bool:
        """Whether :meth:`put` writes an object of ``size`` bytes here: on S3, under
        :data:`~datamask.io.atomic.DIRECT_PUT_MAX`."""
        return self.scheme == "s3" and size <= DIRECT_PUT_MAX

    def put(self, data: bytes) -> bool:
        """Write ``data`` in one request where that is atomic (:meth:`puts_whole`): the
        S3 stream buffers every byte and sends one ``PutObject`` at its close (retried
        whole on transient faults). Returns False, writing nothing, elsewhere:
        :meth:`open_atomic` is the way there."""
        if not self.puts_whole(len(data)):
            return False

        def once() -> None:
            stream = self.fs.open_output_stream(self.path)
            stream.write(data)  # buffered: nothing is sent before the close
            stream.close()

        self._retry(once, "writing")
        return True

    def write_bytes(self, data: bytes) -> None:
        """Write ``data`` atomically."""
        if self.put(data):
            return
        with self.open_atomic() as fh:
            fh.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def delete(self) -> None:
        """Remove the file if present (a missing file, or one that cannot be removed, is
        ignored: a best-effort clean-up). Transient faults are retried; raises
        :class:`~datamask.io.retry.StorageUnavailable` when the store stays unavailable."""
        try:
            self._retry(lambda: self.fs.delete_file(self.path), "deleting")
        except StorageUnavailable:
            raise
        except OSError:
            pass

    def clean_temporaries(self) -> None:
        """Remove hidden temporaries of this target left by killed runs (remote only).

        Object storage has no process ids to test, so this relies on the one-writer rule
        (see docs/remote.md): only one ``datamask`` writes a remote output at a time.
        """
        if self.is_local:
            return
        selector = pafs.FileSelector(self.parent.path, recursive=False, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError:
            return
        for info in infos:
            base = info.path.rsplit("/", 1)[-1]
            if is_temporary(base, self.name):
                with suppress(OSError):
                    self.fs.delete_file(info.path)


def storage_path(where: str | Path | Location) -> Path | Location:
    """Where a sharded run reads or writes: an absolute ``Path`` for a local path or a
    ``file://`` URI, else the remote :class:`Location` (both answer ``/``, ``exists()``,
    ``read_text()``, ``unlink()``, ``glob()``; :func:`open_input` reads either, and
    :func:`datamask.io.atomic.atomic_write` writes either). The text of either, ``str()``,
    is what travels to the steps."""
    if isinstance(where, Location):
        return Path(where.path) if where.is_local else where
    if isinstance(where, Path) or not is_uri(str(where)):
        return Path(os.path.abspath(where))
    loc = resolve(where)
    return Path(loc.path) if loc.is_local else loc


def open_input(where: str | Path | Location) -> Any:
    """A random-access binary file of a local path or a remote object (ranged reads: a
    parquet footer and the row groups asked for, an ``.npz`` member), to use in ``with``."""
    place = storage_path(where)
    if isinstance(place, Location):
        try:
            return place.open_input_file()
        except (FileNotFoundError, StorageUnavailable):
            raise
        except OSError as exc:
            if place.info().type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"{place.uri!r} does not exist") from None
            raise ValueError(f"cannot read {place.uri!r}: {_first_line(exc)}") from None
    return open(place, "rb")


def open_whole(where: str | Path | Location) -> Any:
    """A binary file of an object read whole, to use in ``with``: on object storage its
    bytes in memory after one streamed read, where :func:`open_input`'s ranged reads cost a
    request each (``np.load`` of an ``.npz`` makes 14: its zip directory, then every
    member's header and data); a local file as it is. For objects a step reads whole and
    small next to its own memory (a group's graph, the cluster tree), never a parquet
    shard."""
    place = storage_path(where)
    if isinstance(place, Location):
        try:
            return io.BytesIO(place.read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(f"{place.uri!r} does not exist") from None
    return open(place, "rb")


def names_in(folder: str | Path | Location) -> set[str]:
    """The file names directly in ``folder`` (none when it is missing), from ONE listing:
    how the driver learns which of a phase's markers exist, not one request per step."""
    return set(sizes_in(folder))


def sizes_in(folder: str | Path | Location) -> dict[str, int]:
    """The files directly in ``folder`` and their sizes in bytes, from ONE listing (none
    when the folder is missing)."""
    place = storage_path(folder)
    fs, path = (place.fs, place.path) if isinstance(place, Location) else (_LOCAL, str(place))
    selector = pafs.FileSelector(path, recursive=False, allow_not_found=True)
    try:
        if isinstance(place, Location):
            infos = place._retry(lambda: fs.get_file_info(selector), "listing")
        else:
            infos = fs.get_file_info(selector)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except StorageUnavailable:
        raise
    except OSError as exc:
        raise ValueError(f"cannot list {str(place)!r}: {_first_line(exc)}") from None
    return {i.path.rsplit("/", 1)[-1]: int(i.size) for i in infos if i.type == pafs.FileType.File}


_LOCAL = pafs.LocalFileSystem()


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def _bad(what: str, text: str, why: str) -> ValueError:
    return ValueError(f"{what} {text!r} {why}")


def resolve(text: str | Path, *, what: str = "path") -> Location:
    """The :class:`Location` of ``text``, or a one-line ValueError; nothing is touched.

    Parameters
    ----------
    text : str or Path
        A local path, ``file:///abs/path``, ``s3://bucket/key``, ``gs://bucket/key`` or
        ``hf://datasets/org/name/path``.
    what : str, default="path"
        How the message names it (``"--output"``, ...).

    Examples
    --------
    >>> resolve("data/docs.parquet").scheme
    ''
    >>> resolve("s3://my-bucket/corpus/").path
    'my-bucket/corpus/'
    """
    raw = str(text)
    if not raw.strip():
        raise ValueError(f"{what} is empty; give a local path or a URI such as s3://bucket/key.")
    m = _URI_RE.match(raw)
    if not m or not m["slashes"]:
        return Location(raw, "", pafs.LocalFileSystem(), os.path.abspath(raw))
    scheme = m["scheme"].lower()
    if scheme not in _SCHEMES:
        raise _bad(
            what,
            raw,
            f"has an unknown storage scheme {scheme + '://'!r}; use a local path, file://, "
            "s3://, gs:// or hf://.",
        )
    if not m["slashes"].startswith("//"):
        raise _bad(what, raw, f"is not a valid URI; write {scheme}://{m['rest'].lstrip('/')}.")
    rest = m["slashes"][2:] + m["rest"]
    if scheme == "file":
        if not rest.startswith("/"):
            raise _bad(what, raw, "must be an absolute file URI such as file:///data/docs.")
        return Location(raw, "file", pafs.LocalFileSystem(), rest)
    bucket, _, key = rest.partition("/")
    if scheme == "hf":
        parts = rest.split("/")
        if len(parts) < 3 or parts[0] not in ("datasets", "models", "spaces"):
            raise _bad(
                what, raw, "must look like hf://datasets/<org>/<name>[/path] (or models/...)."
            )
        return Location(raw, "hf", _hf(), rest)
    if not bucket or not _BUCKET_RE.match(bucket):
        raise _bad(what, raw, f"has an invalid bucket name {bucket!r}.")
    if scheme == "s3":
        try:
            fs = _s3_from_env(_s3_retries())
        except (OSError, ValueError) as exc:
            raise _bad(what, raw, f"cannot be opened: {_first_line(exc)}") from None
        return Location(raw, "s3", fs, rest)
    try:
        fs = _gcs(os.environ.get("STORAGE_EMULATOR_HOST") or None)
    except (OSError, ValueError) as exc:
        raise _bad(what, raw, f"cannot be opened: {_first_line(exc)}") from None
    return Location(raw, "gs", fs, rest)


def _check_s3_credentials(loc: Location, what: str) -> None:
    """Refuse an S3 location when no credentials can be found (unless anonymous access is
    asked for with ``DATAMASK_S3_ANONYMOUS=1``).

    The AWS SDK inside pyarrow silently falls back to unsigned requests, which a private
    bucket answers with a bare "access denied" and an S3-compatible server may accept, so
    the credential chain is resolved here with botocore when it is installed (environment,
    profiles, web identity, container and instance roles); without botocore the request
    made by :func:`check_reachable` is the only check.
    """
    if _anonymous_s3():
        return
    try:
        import botocore.session
    except ImportError:
        return
    try:
        credentials = botocore.session.Session().get_credentials()
    except Exception as exc:  # a broken profile or config file
        raise ValueError(
            f"cannot load AWS credentials for {what} {loc.uri!r}: {_first_line(exc)}."
        ) from None
    if credentials is None:
        raise ValueError(
            f"no AWS credentials found for {what} {loc.uri!r}; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (or DATAMASK_S3_ANONYMOUS=1 for a public "
            "bucket)."
        )


def check_reachable(loc: Location, *, what: str = "path") -> None:
    """One request to the bucket of a remote location: refuse a missing bucket, bad
    credentials or an unreachable endpoint with one line. Local locations pass."""
    if loc.is_local:
        return
    if loc.scheme == "s3":
        _check_s3_credentials(loc, what)
    bucket = loc.path.split("/", 1)[0] if loc.scheme != "hf" else "/".join(loc.path.split("/")[:3])
    try:
        probe = _s3_from_env(min(PROBE_ATTEMPTS, _s3_retries())) if loc.scheme == "s3" else loc.fs
        info = probe.get_file_info(bucket)
    except Exception as exc:  # pyarrow raises OSError; fsspec may raise others
        hint = {
            "s3": "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), AWS_REGION "
            "and AWS_ENDPOINT_URL",
            "gs": "check GOOGLE_APPLICATION_CREDENTIALS (or STORAGE_EMULATOR_HOST)",
            "hf": "check HF_TOKEN and the repository name",
        }[loc.scheme if loc.scheme != "gcs" else "gs"]
        raise ValueError(f"cannot reach {what} {loc.uri!r}: {_first_line(exc)}; {hint}.") from None
    if info.type == pafs.FileType.NotFound:
        kind = "repository" if loc.scheme == "hf" else "bucket"
        raise ValueError(
            f"{kind} {bucket!r} of {what} {loc.uri!r} does not exist or these credentials "
            "cannot see it."
        )
