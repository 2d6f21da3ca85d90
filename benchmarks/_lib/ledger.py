"""How a benchmark records a run: ``results/<date>-<machine>-<what>.json``, commit inside.

Every study folder of ``benchmarks/`` keeps its raw runs as one JSON object each:

    {"date": "2026-11-27", "machine": "cpu2", "commit": "12e44df", "command": "...", ...,
     "rows": [...]}

``machine`` names the kind of machine (``cpu2``: the 2-core shared development machine;
``h100``, ``h200``: the GPU machines); set ``DATAMASK_MACHINE`` to name another. ``commit``
is ``git rev-parse --short HEAD``, with ``-dirty`` when the work tree differs from it, or
``"unknown"`` outside a checkout. A script imports this module with its folder's parent on
``sys.path`` (``sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_lib"))``).
Sections of a ``RESULTS.md`` written by a script sit between ``<!-- begin NAME -->`` and
``<!-- end NAME -->`` (:func:`replace_section`); the text around them is written by hand.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "commit",
    "load_runs",
    "machine",
    "replace_section",
    "result_path",
    "run_record",
    "today",
    "write_json",
]


def today() -> str:
    """The UTC date, ``YYYY-MM-DD``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")


def machine() -> str:
    """``DATAMASK_MACHINE``, else ``cpu<cores>`` or the GPU's short name (``h100``)."""
    named = os.environ.get("DATAMASK_MACHINE")
    if named:
        return named
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower()
            for short in ("h200", "h100", "a100", "l4"):
                if short in name:
                    return short
            return "gpu"
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu{cores}"


def commit(where: Path | None = None) -> str:
    """The checkout's short commit (``-dirty`` when it has changes), or ``"unknown"``."""
    where = where or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
        )
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def result_path(folder: Path, what: str, date: str | None = None) -> Path:
    """``folder/results/<date>-<machine>-<what>.json``."""
    return Path(folder) / "results" / f"{date or today()}-{machine()}-{what}.json"


def run_record(**extra: Any) -> dict[str, Any]:
    """The fields every result file starts with: date, machine, commit, command."""
    return {
        "date": today(),
        "machine": machine(),
        "commit": commit(),
        "command": " ".join(["python", *sys.argv]),
        **extra,
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (``path.tmp``, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


def load_runs(folder: Path, what: str) -> list[dict[str, Any]]:
    """Every ``results/*-<what>.json`` of ``folder``, oldest first (by name: the date)."""
    found = sorted((Path(folder) / "results").glob(f"*-{what}.json"))
    return [json.loads(p.read_text()) for p in found]


def replace_section(page: Path, name: str, text: str) -> None:
    """Put ``text`` between ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` of ``page``
    (appended, with the markers, when the page has none)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    old = page.read_text() if page.exists() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}"
    if begin in old and end in old:
        new = old.split(begin, 1)[0] + block + old.split(end, 1)[1]
    else:
        new = old.rstrip() + ("\n\n" if old else "") + block + "\n"
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, page)
