"""The GPU kit's correctness figure: ``tests/test_cuda.py`` and the graph and greedy tests
through pytest, pass/fail counts (and the Ray GPU test where ray is installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch
from kit_common import REPO, Recorder, Sizes

#: What the correctness figure runs on a GPU: all of ``tests/test_cuda.py``, the graph
#: and greedy tests of ``tests/test_neighbors.py``, and the Ray GPU test when ray is there.
CORRECTNESS_TESTS = ("tests/test_cuda.py", "tests/test_neighbors.py")
CORRECTNESS_SELECT = "test_cuda or gpu_workers or bf16 or precision or recall or greedy or topk"


def fig_correctness(rec: Recorder, device: torch.device, sizes: Sizes, args) -> None:
    """The CPU/CUDA tests and the graph tests, through pytest; counts and failures."""
    xml = Path(args.work) / "correctness.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)  # never count an earlier run's
    tests = list(CORRECTNESS_TESTS)
    select = CORRECTNESS_SELECT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    if device.type == "cpu":  # the smoke run: the comparisons against a second CPU copy
        env["DATAMASK_TEST_DEVICE"] = "cpu"
        select = "Pair_simi and values or precision"
    ray_test = "tests/distributed/test_distributed.py::test_gpu_workers_select_on_cuda"
    if device.type != "cuda":
        ray_note = "not run: no CUDA device"
    elif importlib.util.find_spec("ray") is None:
        ray_note = "not run: ray is not installed"
    else:
        tests.append(ray_test)
        ray_note = "run"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *tests,
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        select,
        f"--junitxml={xml}",
        "-o",
        "addopts=",
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    if xml.exists():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
        for case in ET.parse(xml).getroot().iter("testcase"):
            bad = case.find("failure")
            bad = case.find("error") if bad is None else bad
            if bad is not None:
                first = (bad.get("message") or "").splitlines()[:1]
                failed.append(f"{case.get('name')}: {' '.join(first)[:300]}")
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    rec.add(
        command=" ".join(cmd[1:]),
        exit_code=proc.returncode,
        seconds=round(seconds, 2),
        passed=passed,
        failed=counts["failures"] + counts["errors"],
        skipped=counts["skipped"],
        failures=failed,
        ray_gpu_test=ray_note,
        output_tail=(proc.stdout + proc.stderr)[-3000:],
        met=proc.returncode == 0 and passed > 0,
    )
