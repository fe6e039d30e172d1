"""Wall time of the 100-problem sweep of issue 24 (5 models x 5 GPU counts x 2 sequence lengths
x 2 batches on H100), with `--jobs 1` and `--jobs 2`, whole processes, best of N; checks the two
CSVs are byte-identical; then where the time of one process goes (start-up, building the
problems, and per stage of `plan` summed over the problems, from a profile of the in-process
sweep; per model).

    python benchmarks/sweep_speed.py            # best of 3
    python benchmarks/sweep_speed.py --repeat 1 --jobs 1,2,4
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = ["--model", "llama3-8b,llama3-70b,llama3-405b,mixtral-8x7b,deepseek-v3", "--gpu", "h100",
        "--gpus", "64,256,1024,4096,16384", "--seq-len", "4096,8192", "--global-batch",
        "512,2048"]
STAGES = {
    "enumerate layouts": ("enumerate.py", "enumerate_valid"),
    "rules": ("rules.py", "check_rules"),
    "memory ledger": ("memory.py", "memory_ledger"),
    "time ledger": ("time.py", "time_ledger"),
    "ranking's head": ("top.py", "ranked_top"),
    "full plan (nothing fits)": ("plan.py", "plan"),
    "error bands": ("evaluate.py", "bands"),
    "CSV rows": ("frames.py", "rows_frame"),
}


def cli_sweep(out: Path, jobs: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its workers) of one CLI sweep."""
    import resource

    if out.exists():
        out.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "autoparallel", "sweep", *GRID, "--output",
                        str(out), "--jobs", str(jobs)], capture_output=True, text=True)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"sweep --jobs {jobs} failed: {r.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def breakdown() -> None:
    t0 = time.perf_counter()
    from autoparallel.search.space import SearchSpace
    from autoparallel.search.sweep import SweepSpec, _Block, problems_of

    t_import = time.perf_counter() - t0
    spec = SweepSpec(model=GRID[1].split(","), gpu=["h100"],
                     gpus=[int(x) for x in GRID[5].split(",")],
                     seq_len=[int(x) for x in GRID[7].split(",")],
                     global_batch=[int(x) for x in GRID[9].split(",")])
    t0 = time.perf_counter()
    problems = problems_of(spec)
    t_problems = time.perf_counter() - t0
    work = _Block(SearchSpace(), spec.top, None, None)
    per_model: dict[str, float] = {}
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    for p in problems:
        t1 = time.perf_counter()
        prof.enable()
        work(p)
        prof.disable()
        per_model[p.model.name] = per_model.get(p.model.name, 0.0) + time.perf_counter() - t1
    t_plan = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    print(f"one process: imports {t_import:.2f} s, {len(problems)} problems built "
          f"{t_problems:.2f} s, planned {t_plan:.1f} s (profiled)")
    for name, (file, fn) in STAGES.items():
        cum = sum(v[3] for k, v in stats.items() if k[0].endswith(file) and k[2] == fn)
        print(f"  {name:18s} {cum:6.1f} s  {cum / t_plan:5.1%}")
    print("  per model: " + ", ".join(f"{m} {t:.1f} s" for m, t in per_model.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", default="1,2")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="autoparallel-sweep-speed-"))
    print(f"cores available: {len(os.sched_getaffinity(0))}; load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    outs = {}
    for jobs in [int(j) for j in args.jobs.split(",")]:
        out = tmp / f"jobs{jobs}.csv"
        runs = [cli_sweep(out, jobs) for _ in range(args.repeat)]
        times = [w for w, _ in runs]
        outs[jobs] = out.read_bytes()
        rows = outs[jobs].count(b"\n") - 1
        print(f"sweep --jobs {jobs}: best {min(times):.1f} s wall of {args.repeat} "
              f"({', '.join(f'{t:.1f}' for t in times)}), CPU {min(c for _, c in runs):.1f} s "
              f"(process and workers); {rows} rows")
    first = next(iter(outs.values()))
    print("CSVs byte-identical across --jobs: " + ("yes" if all(v == first for v in outs.values())
                                                   else "NO"))
    breakdown()


if __name__ == "__main__":
    main()
