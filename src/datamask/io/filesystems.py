"""The ``pyarrow.fs`` filesystems behind remote URIs, built from the environment.

- ``s3://``: ``pyarrow.fs.S3FileSystem`` from the usual AWS variables, retried with the
  SDK's backoff (``DATAMASK_S3_RETRIES`` attempts per request, default 10), and again
  around each operation where the SDK gives up (:mod:`datamask.io.retry`);
- ``gs://``: ``pyarrow.fs.GcsFileSystem`` (Google default credentials, or the emulator at
  ``STORAGE_EMULATOR_HOST``);
- ``hf://``: ``huggingface_hub.HfFileSystem`` wrapped in ``pyarrow.fs.PyFileSystem``.

:data:`STORAGE_ENV` names every variable that configures them: what a Ray worker needs to
see the same buckets as the driver (:func:`storage_env`).
"""

from __future__ import annotations

import datetime
import functools
import os
from typing import Any

import pyarrow.fs as pafs

from .retry import attempts

__all__ = ["PROBE_ATTEMPTS", "STORAGE_ENV", "storage_env"]

#: The environment variables that configure storage access (credentials, endpoint,
#: region): what a Ray worker needs to see the same buckets as the driver. They are passed
#: to Ray's ``runtime_env`` only, never written to a manifest, marker or message.
STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "DATAMASK_S3_ANONYMOUS",
    "DATAMASK_S3_RETRIES",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "STORAGE_EMULATOR_HOST",
    "HF_TOKEN",
)


def storage_env() -> dict[str, str]:
    """The :data:`STORAGE_ENV` variables set in this process."""
    return {k: os.environ[k] for k in STORAGE_ENV if os.environ.get(k)}


@functools.lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None, anonymous: bool, retries: int = 10) -> Any:
    kwargs: dict[str, Any] = {
        "connect_timeout": 5,
        "request_timeout": 30,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=retries),
        # an object under 5 MB is written by one PutObject when its stream closes, not by
        # the three requests of a multipart upload opened with the stream (apache/arrow
        # #40557); a missing bucket is then refused at the first write, not at the open
        "allow_delayed_open": True,
    }
    if endpoint:
        kwargs["endpoint_override"] = endpoint
        if endpoint.startswith("http://"):
            kwargs["scheme"] = "http"
    if region:
        kwargs["region"] = region
    if anonymous:
        kwargs["anonymous"] = True
    return pafs.S3FileSystem(**kwargs)


def _s3_from_env(retries: int) -> Any:
    """The S3 filesystem the AWS variables describe, making ``retries`` attempts a request."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region is None and endpoint is None:
        region = "us-east-1"  # the AWS default; a bucket elsewhere needs AWS_REGION
    return _s3(endpoint, region, _anonymous_s3(), retries)


#: Attempts of the one request :func:`check_reachable` makes: a wrong endpoint is refused
#: in seconds, not after the whole backoff a transfer is allowed.
PROBE_ATTEMPTS = 2


def _s3_retries() -> int:
    """Attempts per S3 request (throttling, 5xx, dropped connections are retried with
    backoff by the AWS SDK): :func:`datamask.io.retry.attempts`."""
    return attempts()


@functools.lru_cache(maxsize=4)
def _gcs(emulator: str | None = None) -> Any:
    """GCS, or the emulator at ``emulator`` (``[http://]host:port``, anonymous requests)."""
    kwargs: dict[str, Any] = {"retry_time_limit": datetime.timedelta(seconds=15)}
    if emulator:
        scheme, _, host = emulator.rpartition("://")
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme or "http", anonymous=True)
    return pafs.GcsFileSystem(**kwargs)


@functools.lru_cache(maxsize=2)
def _hf() -> Any:
    try:
        from huggingface_hub import HfFileSystem
    except ImportError:
        raise ImportError(
            "Please install `huggingface_hub` to read hf:// paths (`pip install datamask[remote]`)."
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem()))


def _anonymous_s3() -> bool:
    return os.environ.get("DATAMASK_S3_ANONYMOUS", "").lower() in ("1", "true", "yes")
