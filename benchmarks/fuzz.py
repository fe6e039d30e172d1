"""Fuzz the CLI with generated bad input and count the outcomes (issue 13's done-when: >= 5,000
inputs, 0 internal errors, 0 tracebacks, only one-line messages).

    python benchmarks/fuzz.py                 # 1,000 examples per generator, 6 generators
    python benchmarks/fuzz.py --per-kind 2000 --seed 7

Generators and the pass criterion are those of the test suite (`tests/fuzzing.py`); every
example runs in-process. Prints the totals, then each distinct failure with one example.
Exit status 1 when any example failed.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzzing as F  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=1000, help="examples per generator")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="autoparallel-fuzz-"))
    try:
        return _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args, tmp: Path) -> int:
    kinds = {"plan": F.plan_args(), "estimate": F.estimate_args(), "other": F.other_command_args(),
             "files": F.file_case(tmp), "csv": F.csv_case(tmp), "values": F.new_value_args(tmp)}
    failures: collections.Counter = collections.Counter()
    example: dict = {}
    codes: collections.Counter = collections.Counter()
    slowest = (0.0, None)
    t0 = time.perf_counter()
    for kind, strategy in kinds.items():
        @settings(max_examples=args.per_kind, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(argv):
            nonlocal slowest
            start = time.perf_counter()
            code, _, err = F.run_inprocess(argv)
            took = time.perf_counter() - start
            slowest = max(slowest, (took, argv), key=lambda x: x[0])
            codes[code] += 1
            for problem in F.problems(code, err):
                first = next((line for line in err.splitlines() if line.strip()), "")[:160]
                key = (kind, problem, first)
                failures[key] += 1
                example.setdefault(key, argv)

        run._hypothesis_internal_use_seed = args.seed  # reproducible draws
        run()
    total = sum(codes.values())
    print(f"{total:,} generated inputs in {time.perf_counter() - t0:.0f} s; exit codes "
          + ", ".join(f"{c}: {n:,}" for c, n in sorted(codes.items()))
          + f"; failures {sum(failures.values()):,}; slowest {slowest[0]:.1f} s: {slowest[1]}")
    for key, n in failures.most_common():
        print(f"{n:5d}  {key[0]}: {key[1]}: {key[2]}\n       e.g. {example[key]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
