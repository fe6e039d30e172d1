"""Start-up and small-problem wall time of the command line (issue 24's first figures): whole
processes, best of N, each command run the way a user runs it (the installed `autoparallel`
script, else `python -m autoparallel`).

Byte-code decides much of a cold start. A regular `pip install` compiles the package's modules
into `__pycache__` at install time; an editable install leaves that to the first import, and a
shell that sets PYTHONDONTWRITEBYTECODE (some CI images and sandboxes do) never writes them, so
every start compiles every module it imports from source. Both ways are timed:

- **compiled**: the package byte-compiled first (`compileall`, what pip does at install);
- **from source**: the package's `__pycache__` directories removed and PYTHONDONTWRITEBYTECODE
  set, so every run compiles the package's modules (the compiled run then rebuilds the cache).

The dependencies keep their own caches in both (pip compiled them at install). Also printed: the
interpreter's bare start-up (`python -c pass`), the floor under every figure.

    python benchmarks/cli_speed.py              # best of 3
    python benchmarks/cli_speed.py --repeat 5
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoparallel"
PROBLEM = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
           "--global-batch", "64"]
COMMANDS = {
    "--help": ["--help"],
    "plan 8B / 8 H100": ["plan", *PROBLEM],
    "estimate 8B / 8 H100": ["estimate", *PROBLEM, "--tp", "2"],
}
"""What is timed: the label, and the arguments after `autoparallel`."""
TARGETS = {"--help": 0.3, "plan 8B / 8 H100": 0.6}
"""Issue 24's targets, seconds (best of 3 on the project's 2-core machine)."""


def launcher() -> list[str]:
    """The installed console script, else the module run by this interpreter."""
    script = shutil.which("autoparallel")
    return [script] if script else [sys.executable, "-m", "autoparallel"]


def best_of(argv: list[str], env: dict[str, str], repeat: int) -> list[float]:
    """Wall seconds of `repeat` runs of `argv` (output discarded; a failure stops the script)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}; load average "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"launcher: {' '.join(launcher())}; PYTHONDONTWRITEBYTECODE in this shell: "
          f"{'set' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'unset'}")
    for cache in PACKAGE.rglob("__pycache__"):  # nothing of the package cached ...
        shutil.rmtree(cache, ignore_errors=True)
    source = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # ... nor written while timing
    compiled = dict(os.environ)
    floor = min(best_of([sys.executable, "-c", "pass"], compiled, args.repeat))
    print(f"interpreter start-up (python -c pass): {floor:.3f} s")
    runs = {label: [*launcher(), *rest] for label, rest in COMMANDS.items()}
    from_source = {label: best_of(argv, source, args.repeat) for label, argv in runs.items()}
    compileall.compile_dir(str(PACKAGE), quiet=1)  # what pip does at a regular install
    print(f"{'command':24s} {'compiled':>9s} {'from source':>12s}  target")
    for label, argv in runs.items():
        a = best_of(argv, compiled, args.repeat)
        b = from_source[label]
        target = TARGETS.get(label)
        verdict = "" if target is None else (
            f"<= {target:.1f} s: {'met' if min(a) <= target else 'missed'} compiled, "
            f"{'met' if min(b) <= target else 'missed'} from source")
        print(f"{label:24s} {min(a):8.3f}s {min(b):11.3f}s  {verdict}")


if __name__ == "__main__":
    main()
