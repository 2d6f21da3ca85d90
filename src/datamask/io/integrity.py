"""What an atomic write published, and the check that an object is still that.

:func:`~datamask.io.atomic.atomic_write` with ``record={}`` fills the dict with the size
and checksum of the bytes it published (:func:`file_record` of the temporary, taken before
the rename or upload: no extra request). A step's marker can keep that record, and a
reader calls :func:`datamask.io.verify.check_object` before it trusts the object: a torn,
truncated or foreign object (another run's, a hand edit) is refused with one line naming it.

The checksum is BLAKE2b (16 bytes) over the object's bytes: in the standard library, about
1 GB/s on one core.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["CHUNK", "digest", "file_record", "published", "recording"]

#: While :func:`recording` is open: the targets it records (``str`` of each path or URI)
#: and the records of those published so far (target -> record); None outside it.
_PUBLISHED: contextvars.ContextVar[tuple[frozenset[str], dict[str, dict[str, Any]]] | None] = (
    contextvars.ContextVar("datamask_published", default=None)
)


@contextmanager
def recording(targets: Iterable[Any]) -> Iterator[dict[str, dict[str, Any]]]:
    """Collect the record (:func:`file_record`) of each of ``targets`` that an atomic
    write publishes inside the block, by target (``str`` of its path or URI): what a
    step's marker keeps of its outputs. Other writes are not read again."""
    book: dict[str, dict[str, Any]] = {}
    token = _PUBLISHED.set((frozenset(str(t) for t in targets), book))
    try:
        yield book
    finally:
        _PUBLISHED.reset(token)


def published(target: Any, tmp: str | Path) -> dict[str, Any] | None:
    """Record the temporary ``tmp`` about to be published at ``target`` when an open
    :func:`recording` asks for that target; returns the record (None otherwise)."""
    open_book = _PUBLISHED.get()
    if open_book is None or str(target) not in open_book[0]:
        return None
    open_book[1][str(target)] = record = file_record(tmp)
    return record


CHUNK = 1 << 22


def digest(read: Any) -> tuple[int, str]:
    """``(bytes, BLAKE2b hex)`` of what ``read(n)`` yields until it is empty."""
    h, size = hashlib.blake2b(digest_size=16), 0
    while block := read(CHUNK):
        h.update(block)
        size += len(block)
    return size, h.hexdigest()


def file_record(path: str | Path) -> dict[str, Any]:
    """``{"size": bytes, "blake2b": hex}`` of a local file."""
    with open(path, "rb") as fh:
        size, hexdigest = digest(fh.read)
    return {"size": size, "blake2b": hexdigest}
