"""One run per output, on any storage: the claim a run takes before it writes anything.

- **Local paths**: :class:`~datamask.io.atomic.OutputLock`, a ``flock`` (released by the
  kernel when the process dies: a killed run never blocks the next one).
- **Object storage** (:class:`RemoteClaim`): an object, ``OUT/.datamask-claim`` for a
  folder output or ``.<name>.claim`` beside a file output, created with a conditional
  write that cannot race: S3's ``PutObject`` with ``If-None-Match: *`` (through boto3;
  pyarrow cannot send the header). Of two runs, on one host or two, exactly one creates
  it; the other is refused with one line naming the holder (host, pid, run id, start),
  before it writes anything. The object holds that record and is deleted when the run
  ends, whether it succeeded or failed (a ``DeleteObject`` conditional on its ETag, so a
  run never removes another's claim). On this host the runs on one URI also exclude each
  other with a ``flock`` on ``$DATAMASK_CACHE/claims/<hash>`` first.

**A stale claim** is the object of a run killed with ``kill -9`` (or a lost machine): it
stays. A rerun on the *same host* sees that the holder's pid is dead and takes the claim
over by itself (the local ``flock`` makes that check safe). From another host a run cannot
tell a dead holder from a live one, so it is refused with the claim object's URI: delete it
(``aws s3 rm s3://bucket/out/.datamask-claim``) once you know that run is gone, then rerun;
the run resumes as after any kill. ``gs://`` and other stores get the same object written
without a condition (checked, written, read back): two runs started within the same second
on two hosts are not excluded there (docs/remote.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from contextlib import suppress
from typing import Any

from .atomic import OutputLock, _pid_alive
from .fs import Location, cache_dir
from .retry import attempts, retrying

__all__ = ["RemoteClaim", "claim_output", "claim_location"]

CLAIM_NAME = ".datamask-claim"


def claim_location(out: Location, *, folder: bool) -> Location:
    """Where the claim object of the remote output ``out`` lies."""
    return out.join(CLAIM_NAME) if folder else out.parent.join(f".{out.name}.claim")


def claim_output(place: Any, *, folder: bool) -> Any:
    """The claim on an output (a local path or a :class:`~datamask.io.fs.Location`): an
    :class:`~datamask.io.atomic.OutputLock` locally, a :class:`RemoteClaim` on object
    storage. Use it in ``with``; raises a one-line ValueError when another run holds it."""
    if isinstance(place, Location) and not place.is_local:
        return RemoteClaim(place, folder=folder)
    path = place.path if isinstance(place, Location) else place
    return OutputLock(path, folder=folder)


def _s3_client() -> Any:
    """A boto3 S3 client configured as :mod:`datamask.io.filesystems` configures pyarrow."""
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise ImportError(
            "Please install `boto3` to write s3:// outputs: the claim of an output is a "
            "conditional write (`pip install datamask[remote]`)."
        ) from None
    from .filesystems import _anonymous_s3

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = Config(
        retries={"max_attempts": attempts(), "mode": "standard"},
        connect_timeout=5,
        read_timeout=30,
        **({"signature_version": UNSIGNED} if _anonymous_s3() else {}),
    )
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config)


class RemoteClaim:
    """The claim on an output on object storage (see the module docstring).

    Parameters
    ----------
    out : Location
        The output (a folder, or a file with ``folder=False``).
    folder : bool
        Whether ``out`` is a folder output.

    Raises
    ------
    ValueError
        Another run holds the claim (named, with what to do when it is dead).
    """

    def __init__(self, out: Location, *, folder: bool) -> None:
        self.out = out
        self.where = claim_location(out, folder=folder)
        self.record = {
            "run_id": secrets.token_hex(8),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "output": out.uri,
        }
        key = hashlib.sha256(out.uri.rstrip("/").encode()).hexdigest()[:16]
        self._local = OutputLock(cache_dir() / "claims" / key, folder=True)
        self._etag: str | None = None
        try:
            self._acquire()
        except BaseException:
            self._local.release(remove_created=True)
            raise

    # --- the conditional write ------------------------------------------------------------
    def _acquire(self) -> None:
        for _ in range(2):  # a second time only after taking over a dead claim of this host
            if self._create():
                return
            holder, etag = self._holder()
            if holder is None:  # released between the two requests: try again
                continue
            if holder.get("run_id") == self.record["run_id"]:
                return  # our own write, its answer lost and retried
            if holder.get("host") == self.record["host"] and not _pid_alive(
                int(holder.get("pid", 0) or 0)
            ):
                self._remove(etag)  # a dead run of this host (our flock excludes live ones)
                continue
            raise ValueError(
                f"{self.out.uri!r} is being written by another datamask run (pid "
                f"{holder.get('pid')} on {holder.get('host')}, run {holder.get('run_id')}, "
                f"since {holder.get('started')}); wait for it to finish or choose another "
                f"output. If that run is dead (killed on another host), delete "
                f"{self.where.uri} and rerun."
            )
        raise ValueError(f"cannot claim {self.out.uri!r}: {self.where.uri} keeps changing.")

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.where.path.partition("/")
        return bucket, key

    def _create(self) -> bool:
        """Write the claim unless one exists; whether this run wrote it."""
        body = json.dumps(self.record, indent=2).encode()
        what = f"claiming {self.out.uri!r}"
        if self.where.scheme != "s3":  # no conditional write: check, write, read back
            if retrying(lambda: self.where.exists(), what):
                return False
            self.where.write_bytes(body)
            return True
        client = _s3_client()
        bucket, key = self._bucket_key()
        try:
            answer = retrying(
                lambda: client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*"),
                what,
            )
        except Exception as exc:
            if _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return False
            raise
        self._etag = answer.get("ETag")
        return True

    def _holder(self) -> tuple[dict[str, Any] | None, str | None]:
        """The claim's record and ETag (None when it is gone)."""
        if self.where.scheme != "s3":
            try:
                text = self.where.read_text()
            except FileNotFoundError:
                return None, None
            return _parse(text), None
        client = _s3_client()
        bucket, key = self._bucket_key()
        try:
            got = retrying(
                lambda: client.get_object(Bucket=bucket, Key=key), f"reading {self.where.uri}"
            )
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None, None
            raise
        return _parse(got["Body"].read().decode(errors="replace")), got.get("ETag")

    def _remove(self, etag: str | None) -> None:
        if self.where.scheme != "s3":
            self.where.delete()
            return
        client = _s3_client()
        bucket, key = self._bucket_key()
        extra = {"IfMatch": etag} if etag else {}
        try:
            retrying(
                lambda: client.delete_object(Bucket=bucket, Key=key, **extra),
                f"deleting {self.where.uri}",
            )
        except Exception as exc:
            if _code(exc) not in ("PreconditionFailed", "NoSuchKey", "404", "412"):
                raise

    # --- release --------------------------------------------------------------------------
    def release(self) -> None:
        """Delete the claim (only this run's: conditional on its ETag), then the local lock."""
        try:
            if self.where.scheme == "s3":
                with suppress(Exception):
                    self._remove(self._etag)
            else:
                holder, _ = self._holder()
                if holder is not None and holder.get("run_id") == self.record["run_id"]:
                    self._remove(None)
        finally:
            self._local.release(remove_created=True)

    def __enter__(self) -> RemoteClaim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"run_id": "?", "host": "?", "pid": 0, "started": "?"}
    return value if isinstance(value, dict) else {}


def _code(exc: BaseException) -> str:
    """The error code of a botocore ClientError (``""`` for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = str(response.get("Error", {}).get("Code", ""))
    return code or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
