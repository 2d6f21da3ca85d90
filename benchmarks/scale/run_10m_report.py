"""The figures of the 10M run (``run_10m.sh``): gather them once, then print its table.

    python benchmarks/scale/run_10m_report.py --gather  # from /tmp/dm to results/, then the table
    python benchmarks/scale/run_10m_report.py           # the table, from the newest such JSON

The table heads the section "The 10M run" of docs/scale.md (paste it there).

``--gather`` reads what the run left: the segment log (start, end, wall, exit status, load
of every segment, which ones were killed), each segment's stderr (the last elapsed time
of every progress bar, and GNU time's report where the segment ended by itself), the
groups' completion and exchange markers (seconds, peak RSS, worker pid), the final
manifest and ``run.py --results`` JSON, and the disk the run's folders use; it writes them
with date, machine, commit and command first (``benchmarks/_lib/ledger.py``), to
``--results`` when given. Without ``--gather`` the table comes from ``--results``, else from
the newest ``results/*-10m-report.json`` (the one of 2026-11-24: ``run_10m.sh`` at 8bb931a).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "_lib"))
from ledger import result_path, run_record, write_json  # noqa: E402

WHAT = "10m-report"
TMP = Path("/tmp/dm")
BAR = re.compile(
    r"([A-Za-z][A-Za-z0-9 ()-]+?):\s+\d+%\|[^|]*\|\s*([\d.]+[kMG]?)/([\d.]+[kMG]?) \[([0-9:]+)<"
)
TIME_KEYS = {
    "User time (seconds)": "user_s",
    "System time (seconds)": "sys_s",
    "Maximum resident set size (kbytes)": "max_rss_kb",
}


def _seconds(clock: str) -> int:
    out = 0
    for part in clock.split(":"):
        out = out * 60 + int(part)
    return out


def _segment_err(path: Path) -> dict:
    text = path.read_text(errors="replace").replace("\r", "\n") if path.exists() else ""
    bars: dict[str, dict] = {}
    for desc, done, total, clock in BAR.findall(text):
        bars[desc.strip()] = {"done": done, "total": total, "s": _seconds(clock)}
    timing = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        if key in TIME_KEYS:
            timing[TIME_KEYS[key]] = float(value)
    return {"bars": bars, "time": timing}


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _log(path: Path) -> list[dict]:
    """Segments in order. A segment killed by hand with its runner (no end line) and then
    started again keeps its stderr as ``NAME-killed.err``; its wall is start to kill."""
    segments: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) < 3 or not words[0].startswith("seg-"):
            continue
        name = words[0]
        if words[1] == "start" and name in segments:
            old = segments.pop(name)
            old["name"] = f"{name}-killed"
            old.setdefault("wall_s", _at(old["kill_at"]) - _at(old["start"]))
            old.setdefault("rc", 137)
            segments[old["name"]] = old
        seg = segments.setdefault(name, {"name": name, "killed": False})
        if words[1] == "start":
            seg.update(start=words[2], load_start=float(words[3]))
        elif words[1] == "KILL":
            stamp = next(w for w in words if re.match(r"\d{4}-\d\d-\d\dT", w))
            seg.update(killed=True, kill_at=stamp, kill_when=line.split(" -9 ", 1)[-1])
        elif words[1] == "end":
            fields = dict(w.split("=", 1) for w in words[3:] if "=" in w)
            seg.update(end=words[2], rc=int(fields["rc"]), wall_s=float(fields["wall"]))
            seg["load_end"] = float(words[-5])
    for seg in segments.values():  # killed by hand, not yet started again
        if "wall_s" not in seg and "kill_at" in seg:
            seg.update(wall_s=_at(seg["kill_at"]) - _at(seg["start"]), rc=137)
    return list(segments.values())


def _markers(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("*")):
        if path.suffix in ("", ".json") and path.name[:5].isdigit():
            out.append(json.loads(path.read_text()))
    return out


def _du(path: Path) -> int | None:
    if not path.exists():
        return None
    return int(
        subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0]
    )


def gather(out: Path, apply_out: Path) -> dict:
    segments = _log(TMP / "t10m.log")
    for seg in segments:
        seg.update(_segment_err(TMP / f"{seg['name']}.err"))
    work = out / "_work"
    groups = [
        {k: m.get(k) for k in ("gid", "n", "k", "seconds", "peak_rss_mb", "pid")}
        for m in _markers(work / "completions")
        if "gid" in m
    ]
    exchange = [
        {k: m.get(k) for k in ("gid", "seconds", "peak_rss_mb", "graph", "floors")}
        for m in _markers(work / "exchange")
    ]
    final = TMP / "run-10m-final.json"
    disk = {p.name: _du(p) for p in sorted(work.iterdir())} if work.exists() else {}
    disk.update(
        selected=_du(out / "selected"),
        apply_output=_du(apply_out),
        input=_du(TMP / "10m" / "shards"),
    )
    sizes = [  # du -sb after every segment: the work dir's largest size
        int(line.split()[0])
        for line in (TMP / "t10m.log").read_text().splitlines()
        if line.split() and line.split()[0].isdigit() and line.rstrip().endswith(str(out))
    ]
    replay = TMP / "heap10m.jsonl"  # heap_probe.py on single groups, at a later code
    return {
        "replay": [json.loads(x) for x in replay.read_text().splitlines()]
        if replay.exists()
        else [],
        "work_dir_peak_bytes": max(sizes, default=None),
        "segments": segments,
        "groups": groups,
        "exchange": exchange,
        "run": json.loads(final.read_text()) if final.exists() else None,
        "manifest_totals": json.loads((out / "manifest.json").read_text()).get("totals"),
        "disk_bytes": disk,
    }


def markdown(d: dict, source: str) -> str:
    segs = d["segments"]
    lines = [
        "# 10M x 384 generated documents, end to end, on this 2-core machine",
        "",
        f"Generated by `python benchmarks/scale/run_10m_report.py` from `results/{source}`; "
        "do not edit.",
        "",
        "| segment | started | wall s | killed | exit | load start / end | phases (bar: s) |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for s in segs:
        bars = ", ".join(f"{k}: {v['s']}" for k, v in s["bars"].items())
        lines.append(
            f"| {s['name']} | {s.get('start', '')[11:19]} | {s.get('wall_s', 0):,.0f} | "
            f"{'kill -9' if s['killed'] else 'no'} | {s.get('rc', '')} | "
            f"{s.get('load_start', '')} / {s.get('load_end', '')} | {bars} |"
        )
    total = sum(s.get("wall_s", 0) for s in segs)
    lines += ["", f"Wall time over all segments, killed ones included: **{total:,.0f} s**."]
    if d["run"] is not None:
        lines += finished(d, total)
    if d["run"] is None:
        groups = d["groups"]
        lines += [
            "",
            f"**Not finished**: no segment has run to the end yet. {len(groups)} group steps "
            f"are done ({sum(g['seconds']['total'] for g in groups):,.0f} s of worker time, "
            f"largest step peak {max(g['peak_rss_mb'] for g in groups):,.0f} MB).",
        ]
    return "\n".join(lines) + "\n"


#: Which progress bars make up each phase of the cost model (benchmarks/scale/plan.py).
PHASES = {
    "plan": ("check inputs", "k-means sample", "assign clusters"),
    "select": ("propose candidates", "propose more"),
    "global": ("exchange", "write"),
    "merge": ("keep lists",),
    "apply": ("apply",),
}


def phase_seconds(segments: list[dict]) -> dict[str, float]:
    """Seconds per phase, summed over the segments' progress bars (work a kill lost
    included). A resumed run checks its inputs again: only the first check is the plan's,
    the others are ``resume_checks``."""
    out = {name: 0.0 for name in (*PHASES, "resume_checks")}
    checked = False
    for seg in segments:
        for bar, v in seg["bars"].items():
            if bar == "check inputs":
                out["plan" if not checked else "resume_checks"] += v["s"]
                checked = True
                continue
            phase = next((p for p, bars in PHASES.items() if bar.startswith(bars)), None)
            if phase is not None:
                out[phase] += v["s"]
    return out


REPLAY_CODE = "7f71f14 + heap_probe reading the group with steps.read_group"
NOTES = """\
Notes. The run's code is e29be48, frozen for the whole run (`git worktree`). Two memory
faults it still had were found by this run and fixed after it: the worker's heap
ratcheted up step after step (glibc's mmap threshold; fixed in f6e0df1), and the exchange
round's floors built one unbounded (queries, members) block per ivf list (10.2 GB in an
exchange step; fixed in e459d76). The peaks above are each worker process' lifetime
peak (`getrusage`), so they carry both. For part of the select phase the machine also ran
other measurements of the session before (J runs, heap probes, the test suite); the
replays above skip the exact scoring of the group that the run's steps still did (an
n x k pass; 18 s for 70,000 x 14,000 in a profile of this session), and group 138 took
about as long as in the run, so contention is not the main reason the 10M steps cost
more per document (docs/scale.md, the plan)."""


def finished(d: dict, wall: float) -> list[str]:
    """The finished run: phases, throughput, memory per process, disk."""
    segs, run = d["segments"], d["run"]
    n = run["n_docs"]
    ph = phase_seconds(segs)
    select_wall = sum(ph[p] for p in ("plan", "select", "global", "merge"))
    groups, exch = d["groups"], d["exchange"]
    timed = [s for s in segs if s["time"]]
    lines = [
        "",
        f"{n:,} documents, {run['n_groups']} groups, k = {run['k']:,}, `--workers 2`.",
        "",
        "| phase | seconds (progress bars, summed over segments) |",
        "|---|---:|",
    ]
    lines += [f"| {p} | {v:,.0f} |" for p, v in ph.items()]
    lines += [
        "",
        f"- `select`, end to end: **{select_wall:,.0f} s** of phases = **{n / select_wall:,.0f} "
        f"documents/s**; with `apply` {select_wall + ph['apply']:,.0f} s "
        f"({n / (select_wall + ph['apply']):,.0f} documents/s). Every segment's wall time, "
        f"kills and resumes included: {wall:,.0f} s ({n / wall:,.0f} documents/s).",
        f"- Worker time: {sum(g['seconds']['total'] for g in groups):,.0f} s in the "
        f"{len(groups)} select steps that finished, "
        f"{sum(e['seconds']['total'] for e in exch):,.0f} s in {len(exch)} exchange steps.",
        f"- Peak RSS per process: largest select step "
        f"{max(g['peak_rss_mb'] for g in groups):,.0f} MB (median "
        f"{sorted(g['peak_rss_mb'] for g in groups)[len(groups) // 2]:,.0f} MB), largest "
        f"exchange step {max(e['peak_rss_mb'] for e in exch):,.0f} MB, the driver "
        f"{run.get('driver_peak_rss_mb') or 0:,.0f} MB (last segment); GNU time's largest "
        "process per segment that ended by itself: "
        + ", ".join(f"{s['name']} {s['time']['max_rss_kb'] / 1024:,.0f} MB" for s in timed)
        + ".",
        "- CPU (user + sys, segments that ended by themselves): "
        + ", ".join(
            f"{s['name']} {s['time']['user_s']:,.0f} + {s['time']['sys_s']:,.0f} s" for s in timed
        )
        + ".",
        "",
        "| disk | GB |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v / 1e9:.1f} |" for k, v in d["disk_bytes"].items() if v is not None]
    by_gid = {g["gid"]: g for g in groups}
    if d.get("replay"):
        lines += [
            "",
            "Single select steps of this run replayed alone, each in a fresh process, at a",
            f"later code ({REPLAY_CODE}: bounded heap, no exact scoring of the group), 1 thread",
            "as a worker of 2 on 2 cores",
            "(`benchmarks/archive/scale/heap_probe.py --run ... --gids G`):",
            "",
            "| group | rows | candidates | in the run: s / worker peak MB | replay: s / peak MB |",
            "|---:|---:|---:|---|---|",
        ]
        for r in d["replay"]:
            (st,) = r["steps"]
            g = by_gid[st["gid"]]
            lines.append(
                f"| {st['gid']} | {st['n']:,} | {st['k']:,} | {g['seconds']['total']:,.0f} / "
                f"{g['peak_rss_mb']:,.0f} | {st['seconds']:,.0f} / {r['peak_mb']:,.0f} |"
            )
    lines += ["", NOTES]
    if d.get("work_dir_peak_bytes"):
        lines += [
            "",
            f"The output folder (work dir included) peaked at "
            f"{d['work_dir_peak_bytes'] / 1e9:.1f} GB (`du` after each segment); the table is "
            "its size at the end.",
        ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gather", action="store_true")
    ap.add_argument("--out", type=Path, default=TMP / "run-10m")
    ap.add_argument("--apply-out", type=Path, default=TMP / "apply-10m")
    ap.add_argument("--results", type=Path, help=f"default: results/<date>-<machine>-{WHAT}.json")
    args = ap.parse_args()
    if args.gather:
        path = args.results or result_path(HERE, WHAT)
        write_json(path, {**run_record(), **gather(args.out, args.apply_out)})
    else:
        found = sorted((HERE / "results").glob(f"*-{WHAT}.json"))
        path = args.results or (found[-1] if found else None)
        if path is None:
            ap.error(f"no results/*-{WHAT}.json: run with --gather first")
    print(markdown(json.loads(path.read_text()), path.name))


if __name__ == "__main__":
    main()
