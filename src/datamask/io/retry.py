"""The one retry policy of object storage: which errors are transient, how often and how
long to retry them, and the error a run stops with when the store stays unavailable.

Two layers retry, both bounded by ``$DATAMASK_S3_RETRIES`` (:func:`attempts`, default 10):

1. the AWS SDK inside ``pyarrow.fs.S3FileSystem`` retries each request (throttling, 5xx,
   dropped connections, an error inside a 200 OK of CopyObject or CompleteMultipartUpload)
   with its own backoff (:mod:`datamask.io.filesystems`);
2. :func:`retrying` retries a whole operation of :mod:`datamask.io.fs` (a listing, an
   object's metadata, a read, an atomic upload) when the SDK gave up or never tried: a
   ranged read answered ``503 SlowDown`` fails inside the SDK ("Failed to flush response
   stream": the error body does not fit the range asked for) and is not retried there;
   a long outage drains the SDK's retry quota. :class:`RetryingFile` does it per read for
   the files parquet and ``np.load`` read from (reopen, seek back, read again).

When the attempts run out, :class:`StorageUnavailable` (an ``OSError``) names the store
and the object; the CLI prints it on one line and exits 1, never as bad input (exit 2):
every write of a run is atomic, so rerunning the same command resumes.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "StorageUnavailable",
    "RetryingFile",
    "attempts",
    "is_transient",
    "raise_if_unavailable",
    "retrying",
]

T = TypeVar("T")

#: Error texts of a passing fault: AWS SDK error names as pyarrow prints them, S3 error
#: codes, HTTP 5xx, curl and socket failures, Google Cloud status codes.
_TRANSIENT = re.compile(
    r"NETWORK_CONNECTION|INTERNAL_FAILURE|SERVICE_UNAVAILABLE|SLOW_DOWN|THROTTLING"
    r"|REQUEST_TIMEOUT|SlowDown|Throttl|InternalError|ServiceUnavailable|RequestTimeout"
    r"|NoSuchUpload|HTTP status 5\d\d|HTTP response code: 5\d\d|curlCode|Empty reply"
    r"|Connection reset|Connection refused|Connection was closed|Broken pipe|timed out"
    r"|Couldn't connect|\bUNAVAILABLE\b|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED",
)


class StorageUnavailable(OSError):
    """Object storage did not answer an operation after every attempt (exit status 1: a
    rerun of the same command resumes)."""


def attempts() -> int:
    """Attempts per request and per operation: ``$DATAMASK_S3_RETRIES``, default 10."""
    text = os.environ.get("DATAMASK_S3_RETRIES", "10")
    try:
        return max(1, int(text))
    except ValueError:
        raise ValueError(f"DATAMASK_S3_RETRIES must be a whole number; got {text!r}.") from None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a passing fault of the store (worth another attempt)."""
    if isinstance(exc, StorageUnavailable | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, FileNotFoundError | PermissionError | NotADirectoryError):
        return False
    if type(exc).__module__.startswith(("botocore", "urllib3")):
        response = getattr(exc, "response", None) or {}
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int) and status >= 500:
            return True
        name = type(exc).__name__
        if name.endswith(("ConnectionError", "ConnectionClosedError", "TimeoutError")):
            return True
        return bool(_TRANSIENT.search(code))
    if not isinstance(exc, OSError):
        return False
    return bool(_TRANSIENT.search(str(exc)))


def _endpoint() -> str:
    return (
        os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("STORAGE_EMULATOR_HOST")
        or "the object store"
    )


def unavailable(what: str, exc: BaseException, tries: int) -> StorageUnavailable:
    """The one-line error of an operation the store did not answer."""
    if isinstance(exc, StorageUnavailable):
        return exc
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return StorageUnavailable(
        f"object storage at {_endpoint()} is unavailable ({what}: {reason}; {tries} "
        "attempt(s)); nothing was left half-written: rerun the same command to resume."
    )


def raise_if_unavailable(exc: BaseException, what: str) -> None:
    """Raise :class:`StorageUnavailable` for a transient ``exc`` (else return): what the
    ``except`` blocks that turn a bad file into a one-line ValueError call first, so an
    outage is never reported as bad input."""
    if is_transient(exc):
        raise unavailable(what, exc, 1) from None


def _pause(attempt: int) -> None:
    """Exponential backoff with full jitter: up to 0.1 s, 0.2 s, ... at most 8 s."""
    time.sleep(random.uniform(0.5, 1.0) * min(8.0, 0.1 * 2**attempt))


def retrying(call: Callable[[], T], what: str, *, tries: int | None = None) -> T:
    """``call()``, retried with backoff while it raises a transient error.

    Parameters
    ----------
    call : callable
        The operation; it must be safe to repeat (a read, a listing, an upload to a fresh
        temporary key, a copy, a delete).
    what : str
        The operation and object, as the error names them (``"reading 's3://b/k'"``).
    tries : int, optional
        Attempts (default :func:`attempts`).

    Raises
    ------
    StorageUnavailable
        When every attempt failed with a transient error. Other errors pass unchanged.
    """
    n = tries or attempts()
    for attempt in range(n):
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt == n - 1:
                raise unavailable(what, exc, n) from None
            _pause(attempt)
    raise AssertionError("unreachable")


class RetryingFile:
    """A read-only binary file over an object that survives transient faults: a read that
    fails is retried (:func:`retrying`) on a freshly opened file at the same position.

    ``open_file`` opens the object as a random-access pyarrow file. The first file may be
    a sequential stream (``first``): one request for a whole object, as before; a retry
    switches to ranged reads from where the stream stopped. Pass it to
    ``pq.ParquetFile``, ``np.load`` or ``zipfile``, or read it directly.
    """

    def __init__(self, open_file: Callable[[], Any], what: str, first: Any = None) -> None:
        self._open, self.what = open_file, what
        self._fh = first if first is not None else retrying(open_file, what)
        self._seekable = first is None
        self._pos = 0
        self.closed = False

    def _reopen(self) -> None:
        with contextlib.suppress(Exception):  # a broken connection: a new file replaces it
            self._fh.close()
        self._fh = self._open()
        self._seekable = True
        if self._pos:
            self._fh.seek(self._pos)

    def _attempt(self, op: Callable[[Any], T]) -> T:
        first = [True]

        def once() -> T:
            if not first[0]:
                self._reopen()
            first[0] = False
            return op(self._fh)

        return retrying(once, self.what)

    def read(self, n: int = -1) -> bytes:
        data = self._attempt(lambda fh: fh.read() if n is None or n < 0 else fh.read(n))
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def read_at(self, n: int, offset: int) -> bytes:
        self.seek(offset)
        return self.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            target = offset
        elif whence == 1:
            target = self._pos + offset
        else:
            target = self.size() + offset
        if target != self._pos:
            self._pos = target
            if self._seekable:
                self._attempt(lambda fh: fh.seek(target))
            else:
                retrying(self._reopen, self.what)  # a stream cannot seek: ranged reads now
        return target

    def size(self) -> int:
        if not self._seekable:
            retrying(self._reopen, self.what)
        return self._attempt(lambda fh: fh.size())

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self._fh.close()

    def __enter__(self) -> RetryingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
