"""What an atomic write published, and the check that an object is still that.

:func:`~datamask.io.atomic.atomic_write` with ``record={}`` fills the dict with the size
and checksum of the bytes it published (:func:`file_record` of the temporary, taken before
the rename or upload: no extra request). A step's marker can keep that record, and a
reader calls :func:`check_object` before it trusts the object: a torn, truncated or
foreign object (another run's, a hand edit) is refused with one line naming it.

The checksum is BLAKE2b (16 bytes) over the object's bytes: in the standard library, about
1 GB/s on one core.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["CHUNK", "check_object", "file_record"]

CHUNK = 1 << 22


def _digest(read: Any) -> tuple[int, str]:
    h, size = hashlib.blake2b(digest_size=16), 0
    while block := read(CHUNK):
        h.update(block)
        size += len(block)
    return size, h.hexdigest()


def file_record(path: str | Path) -> dict[str, Any]:
    """``{"size": bytes, "blake2b": hex}`` of a local file."""
    with open(path, "rb") as fh:
        size, digest = _digest(fh.read)
    return {"size": size, "blake2b": digest}


def check_object(where: Any, record: dict[str, Any]) -> None:
    """Refuse the object at ``where`` (a local path or a :class:`~datamask.io.fs.Location`)
    unless it exists with the size and checksum of ``record`` (:func:`file_record`).

    The size is compared first (one metadata request), the checksum then by reading the
    object once.

    Raises
    ------
    ValueError
        The object is missing, or its size or checksum differs; one line naming it.
    """
    from .fs import Location, storage_path

    place = where if isinstance(where, Location) else storage_path(where)
    name = str(place)
    rerun = "it was changed or replaced after its step wrote it; rerun to recompute it."
    if isinstance(place, Location) and not place.is_local:
        info = place.info()
        size = info.size if info.is_file else None
    else:
        p = Path(place.path if isinstance(place, Location) else place)
        size = p.stat().st_size if p.is_file() else None
    if size is None:
        raise ValueError(f"{name!r} is missing; {rerun}")
    if size != record["size"]:
        raise ValueError(f"{name!r} holds {size} bytes, not the {record['size']} written; {rerun}")
    if isinstance(place, Location) and not place.is_local:
        with place.open_input_stream() as fh:
            _, digest = _digest(fh.read)
    else:
        digest = file_record(p)["blake2b"]
    if digest != record["blake2b"]:
        raise ValueError(f"{name!r} does not hold the bytes written (checksum differs); {rerun}")
