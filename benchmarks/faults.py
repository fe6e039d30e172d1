"""Fault suite: random kill points, random cut offsets, signals, full devices, two writers,
outputs on /dev/full, absurd measurements, broken storages, strict JSON; counted and printed
like benchmarks/fuzz.py (issue 26's done-when: >= 50 kill points and >= 50 cut offsets, every
resumed sweep byte-identical to an uninterrupted run; no exit 70, no 0-byte file, no absurd
step time COMPLETE, every --format json strict).

    python benchmarks/faults.py                       # the default counts below
    python benchmarks/faults.py --cuts 200 --kills 100 --seed 3
    python benchmarks/faults.py --only cut,full       # some kinds only

Kill points: half are SIGKILLs of the command-line sweep (`--jobs 2`, worker processes
included) at a random moment between its start and the end of an uninterrupted run, half of a
forked in-process sweep right after a random number of written problems. Full devices: a random
file-size limit (EFBIG), and, when this machine can mount a tmpfs (root), a real full disk
(ENOSPC) at a random fill level. The cases are those of the test suite (`tests/faultkit.py`).
Exit status 1 when any case failed.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import faultkit as F  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuts", type=int, default=50)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--signals", type=int, default=20)
    ap.add_argument("--full", type=int, default=20)
    ap.add_argument("--enospc", type=int, default=10)
    ap.add_argument("--writers", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="comma-separated kinds to run")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="autoparallel-faults-"))
    only = set(args.only.split(",")) if args.only else None
    counts: collections.Counter = collections.Counter()
    failures: collections.Counter = collections.Counter()
    example: dict = {}
    took: collections.Counter = collections.Counter()
    notes: collections.Counter = collections.Counter()

    def run(kind: str, fn) -> None:
        if only and kind not in only:
            return
        t0 = time.perf_counter()
        try:
            bad = fn()
        except Exception as exc:  # a case that crashes is a failure too
            bad = [f"the case raised {type(exc).__name__}: {exc}"]
        took[kind] += time.perf_counter() - t0
        counts[kind] += 1
        for b in [b for b in bad if b.startswith(F.NOTE)]:
            notes[(kind, b[len(F.NOTE):])] += 1
        for b in [b for b in bad if not b.startswith(F.NOTE)]:
            key = (kind, b.split(":")[0][:60])
            failures[key] += 1
            example.setdefault(key, b)

    t_start = time.perf_counter()
    F.reference(tmp)
    if not only or {"kill", "signal"} & only:
        F.reference(tmp, F.LARGER)
        t0 = time.perf_counter()
        r = F.cli("sweep", *F.LARGER, "--output", tmp / "timing.csv", "--jobs", 2)
        span = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr
    else:
        span = 0.0
    for _ in range(args.cuts):
        run("cut", lambda: F.cut_case(rng, tmp))
    for i in range(args.kills):
        if i % 2:
            run("kill", lambda: F.kill_case(rng, tmp))
        else:
            run("kill", lambda: F.cli_kill_case(rng, tmp, delay=rng.uniform(0, span)))
    for i in range(args.signals):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        run("signal", lambda: F.signal_case(rng, tmp, sig, delay=rng.uniform(0, span)))
    for _ in range(args.full):
        run("full", lambda: F.full_case(rng, tmp))
    if args.enospc and (not only or "enospc" in only):
        probe = tmp / "probe"
        if F.tmpfs(probe, 64):
            F.umount(probe)
            for _ in range(args.enospc):
                run("enospc", lambda: F.enospc_case(rng, tmp))
        else:
            print("enospc: skipped (cannot mount a tmpfs here; needs root)")
    for i in range(args.writers):
        run("two_writers", lambda: F.two_writers_case(rng, tmp, wait=bool(i % 2)))
    for name, argv in F.devfull_commands(tmp):
        run("devfull", lambda: F.devfull_case(name, argv))
    for argv in (["schema", "plan"], ["presets", "models"], ["plan", "--model", "llama3-8b",
                 "--gpu", "h100", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64"]):
        run("devfull", lambda: F.stdout_full_case(argv))
    for value in F.ABSURD:
        run("absurd", lambda: F.absurd_case(tmp, value))
    for name, path in F.storage_files(tmp).items():
        run("storage", lambda: F.storage_case(name, path))
    if F.tmpfs(tmp / "probe2", 64):  # root: a read-only mount too
        F.umount(tmp / "probe2")
        run("storage", lambda: F.readonly_storage_case(tmp))
    for argv in F.json_cases():
        run("json", lambda: F.json_case(argv))
    total = sum(counts.values())
    print(f"{total:,} fault cases in {time.perf_counter() - t_start:.0f} s; failures "
          f"{sum(failures.values()):,}")
    for kind in counts:
        bad = sum(n for (k, _), n in failures.items() if k == kind)
        print(f"  {kind:12s} {counts[kind]:5d} cases, {bad:3d} failed  ({took[kind]:.0f} s)")
    for key, n in failures.most_common():
        print(f"{n:5d}  {key[0]}: {example[key]}")
    for (kind, text), n in notes.most_common():
        print(f"{n:5d}  {kind} (not a failure): {text}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
