"""Sizes as people read them: one formatter for every size datamask prints.

``format_bytes(n)`` writes ``n`` bytes in the largest decimal unit (B, KB, MB, GB, TB;
1 KB = 1000 B) in which it is at least 1, so a small input reads "40.2 KB", never
"0.0 GB", and a large one "1.5 TB", never "1500.0 GB".
"""

from __future__ import annotations

import math

__all__ = ["UNITS", "format_bytes", "format_mib"]

UNITS = ("B", "KB", "MB", "GB", "TB")


def format_bytes(n: float) -> str:
    """``n`` bytes in the unit that fits: ``0 B``, ``512 B``, ``40.2 KB``, ``3.1 GB``.

    Whole bytes below 1 KB; one decimal above (none from 100 up); NaN reads ``unknown``.

    >>> [format_bytes(v) for v in (0, 512, 40_200, 3.1e9, 123.4e6, 2.5e13)]
    ['0 B', '512 B', '40.2 KB', '3.1 GB', '123 MB', '25.0 TB']
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "unknown"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    if n < 1000:
        return f"{sign}{n:.0f} B"
    unit = 0
    while n >= 1000 and unit < len(UNITS) - 1:
        n /= 1000
        unit += 1
    if round(n, 1) >= 1000 and unit < len(UNITS) - 1:  # 999.96 KB reads 1.0 MB
        n /= 1000
        unit += 1
    digits = 0 if n >= 99.95 else 1
    return f"{sign}{n:.{digits}f} {UNITS[unit]}"


def format_mib(mib: float | None) -> str:
    """A size measured in MiB (resident memory: ``ru_maxrss``, ``/proc``) through
    :func:`format_bytes`."""
    if mib is None:
        return "unknown"
    return format_bytes(float(mib) * 2**20)
