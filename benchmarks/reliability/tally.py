"""Run every case of the reliability battery against a datamask source tree; tally them.

    git archive c88bf86 src | tar -x -C /tmp/before     # the code before issue 9
    PYTHONPATH=src python benchmarks/reliability/tally.py /tmp/before/src > before.jsonl
    PYTHONPATH=src python benchmarks/reliability/tally.py src > after.jsonl

Each case of ``tests/cli/test_reliability.py::CASES`` is built in a fresh folder and run as
``python -m datamask.cli`` with ``PYTHONPATH`` set to the tree given. Handled means: exit
status 2, one line on stderr holding the case's key words (what the test matches: the
broken thing named), no traceback, no file written, the input untouched. One JSON line per
case, then the count.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the tests package
import tests.cli.test_reliability as T  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="the datamask source tree to run (its src/ folder)")
    p.add_argument("cases", nargs="*", help="case names of CASES (default: every case)")
    args = p.parse_args()
    src = args.src
    os.environ["DATAMASK_BATTERY_SRC"] = src  # a case's own earlier steps run that tree too
    only = args.cases or list(T.CASES)
    rows = []
    for name in only:
        with tempfile.TemporaryDirectory() as d:
            t = Path(d)
            argv, match = T.CASES[name](t)
            before = T.snapshot(t)
            start = time.perf_counter()
            try:
                p = subprocess.run(
                    [sys.executable, "-m", "datamask.cli", *map(str, argv)],
                    capture_output=True,
                    text=True,
                    timeout=90,
                    env={**os.environ, "PYTHONPATH": src},
                    cwd=t,  # `python -m` puts it on sys.path: user term modules a case writes
                )
                rc, err = p.returncode, p.stderr.strip()
            except subprocess.TimeoutExpired:
                rc, err = "timeout(90s)", ""
            secs = time.perf_counter() - start
            after = T.snapshot(t)
            written = sorted(set(after) - set(before))
            changed = sorted(k for k in before if after.get(k) != before[k])
            lines = [line for line in err.splitlines() if line.strip()]
            named = bool(match) and match in err  # the key words: the broken thing named
            ok = (
                rc == 2
                and len(lines) == 1
                and named
                and "Traceback" not in err
                and not written
                and not changed
            )
            rows.append(
                dict(
                    case=name,
                    rc=rc,
                    lines=len(lines),
                    traceback="Traceback" in err,
                    named=named,
                    written=written[:3],
                    input_changed=changed[:3],
                    ok=ok,
                    s=round(secs, 1),
                    first=(lines[-1][:400] if lines else ""),
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    print("handled", sum(r["ok"] for r in rows), "of", len(rows))


if __name__ == "__main__":  # the sharded cases start a process pool (spawn)
    main()
