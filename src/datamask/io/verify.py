"""The check that an object is still what a step published: its size, then its
BLAKE2b (:mod:`datamask.io.integrity` records both when an atomic write publishes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .fs import Location, storage_path
from .integrity import digest, file_record

__all__ = ["check_object"]


def check_object(where: Any, record: dict[str, Any]) -> None:
    """Refuse the object at ``where`` (a local path or a :class:`Location`) unless it
    exists with the size and checksum of ``record``
    (:func:`~datamask.io.integrity.file_record`).

    The size is compared first (one metadata request), the checksum then by reading the
    object once.

    Raises
    ------
    ValueError
        The object is missing, or its size or checksum differs; one line naming it.
    """
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
            _, hexdigest = digest(fh.read)
    else:
        hexdigest = file_record(p)["blake2b"]
    if hexdigest != record["blake2b"]:
        raise ValueError(f"{name!r} does not hold the bytes written (checksum differs); {rerun}")
