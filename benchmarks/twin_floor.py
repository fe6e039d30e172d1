"""The error no model can avoid on the shipped runs: rows measured apart with the same inputs.

Groups the usable runs into twins (`autoparallel.validation.replicates`: everything the planner
is given the same), and prints per architecture and per source how many rows have a twin, the
largest measured spread within a group, the floor (the least median / p90 |error| any
deterministic model can score, each group predicted at its best constant) beside the model's own
error (in sample, or held out with --loso), and the twin groups measured furthest apart.
Benchmarks print figures; nothing here is asserted.

    python benchmarks/twin_floor.py [--runs FILE] [--loso] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.validation.replicates import floor_summary, twin_table  # noqa: E402
from autoparallel.validation.report import predict  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

GPUS = "h100,h100-96gb,h200,h800,a100-80gb,a100-40gb,b200,b300,gb200,gb300"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(PUBLISHED_RUNS), help="runs CSV (default: the shipped one)")
    ap.add_argument("--loso", action="store_true",
                    help="compare with the leave-one-source-out errors (slower) instead of in sample")
    ap.add_argument("--top", type=int, default=15, help="twin groups to list, widest spread first")
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 70)

    cases, skipped = load_cases(read_runs(args.runs))
    if args.loso:
        from autoparallel.validation.loso import loso_predictions
        pred, _ = loso_predictions(cases, GPUS.split(","))
        basis = "held out (leave-one-source-out)"
    else:
        pred = predict(cases)
        basis = "in sample (the shipped profiles)"
    table = twin_table(cases, pred)
    print(f"{len(cases)} usable runs ({len(skipped)} skipped); model errors {basis}\n")
    pct = {c: "{:.1%}" for c in ("floor_median_abs_err", "floor_p90_abs_err",
                                 "model_median_abs_err", "model_p90_abs_err")}
    pct["largest_spread"] = "{:.2f}x"
    for by in ("arch", "source"):
        s = floor_summary(table, by=by)
        for k, f in pct.items():
            s[k] = s[k].map(lambda v, f=f: "-" if pd.isna(v) else f.format(v))
        print(f"== twins and the error floor, by {by}")
        print(s.to_string(index=False), "\n")

    twins = table[table["twins"] > 1]
    groups = (twins.groupby("key")
              .agg(rows=("row_id", ", ".join), model=("model", "first"), gpu=("gpu", "first"),
                   fastest_s=("measured_step_s", "min"), slowest_s=("measured_step_s", "max"),
                   model_err=("step_err", lambda s: ", ".join(f"{v:+.0%}" for v in s)))
              .assign(spread=lambda g: g["slowest_s"] / g["fastest_s"])
              .sort_values("spread", ascending=False).head(args.top))
    print(f"== the {len(groups)} twin groups measured furthest apart")
    print(groups.drop(columns=[]).reset_index(drop=True).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
