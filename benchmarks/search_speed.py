"""Speed of the search (issue: >= 1e6 layouts scored per second; plan <= 1 s).

Problems: llama3-405b on 16,384 H100, seq 8192, global batch 2048, every axis open; and
deepseek-v3 on 16,384 H100, seq 4096, global batch 8192, with the MoE axes (ep, etp) open.
Prints: layouts enumerated, rows scored per second by the full cost model (rules + memory +
time over every enumerated row, feasible or not; over the rows that pass the rules where
building every candidate would exceed `MAX_LAYOUTS`), and the wall time of `plan` (enumerate,
rules, memory for valid rows, time for fitting rows, rank). Best of 5 runs each.
Run: python benchmarks/search_speed.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autoparallel import evaluate, make_problem  # noqa: E402
from autoparallel.cost.model_arch import build_arch  # noqa: E402
from autoparallel.errors import SpecError  # noqa: E402
from autoparallel.search.enumerate import enumerate_layouts, enumerate_valid  # noqa: E402
from autoparallel.search.plan import plan  # noqa: E402


def best_of(fn, n=5):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    for args in (("llama3-405b", "h100", 16384, 8192, 2048),
                 ("deepseek-v3", "h100", 16384, 4096, 8192)):
        report(make_problem(*args), args)


def report(problem, args) -> None:
    arch = build_arch(problem.model)
    which = "all rows"
    try:
        t_enum, table = best_of(lambda: enumerate_layouts(problem))
    except SpecError:  # beyond MAX_LAYOUTS built at once: the rows that pass the rules
        which = "rule-passing rows"
        t_enum, table = best_of(lambda: enumerate_valid(problem).table)
    t_eval, ev = best_of(lambda: evaluate(problem, table, arch=arch))
    t_plan, res = best_of(lambda: plan(problem, top=10))
    print(f"problem: {args[0]}, {args[2]} x {args[1]}, seq {args[3]}, global batch {args[4]}, "
          "all axes open")
    print(f"layouts enumerated:        {res.n_layouts:>12,}  ({which} built: {len(table):,}, "
          f"{t_enum * 1e3:.1f} ms)")
    print(f"costed / fit:              {res.n_valid:>12,} / {res.n_fit:,}  (plan costs the rows "
          "that pass the rules, less the dominated CP splits)")
    print(f"full cost model, {which}: {len(table) / t_eval:>12,.0f} layouts/s "
          f"({t_eval * 1e3:.1f} ms)")
    print(f"plan wall time:            {t_plan * 1e3:>12.1f} ms  (#1 {res.ranked.table.row(0).slug}, "
          f"step {res.ranked.time['step'][0]:.3f} s)")


if __name__ == "__main__":
    main()
