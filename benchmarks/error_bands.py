"""Write the error-band table `autoparallel/data/error_bands.csv` from leave-one-source-out
validation residuals, and print its coverage on the shared runs.

    python benchmarks/error_bands.py [--runs FILE] [--loso loso.csv] [--output PATH] [--check]

`--loso` reuses held-out predictions written by `benchmarks/validate.py --output` (the LOSO fits
take about two minutes); otherwise they are computed. `--check` prints coverage only and writes
nothing. Coverage: the share of runs whose measured step lies inside the band, with the shipped
quantiles (estimated on all runs) and nested (quantiles estimated without the run's source).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.bands import BAND_FILE  # noqa: E402
from autoparallel.validation.error_bands import (band_rows, coverage, coverage_summary,  # noqa: E402
                                                 memory_coverage, memory_residual_frame,
                                                 residual_frame, write_table)
from autoparallel.validation.runs import read_runs  # noqa: E402

DEFAULT_RUNS = Path(__file__).resolve().parents[2] / "shared" / "data" / "published_runs.csv"
GPUS = "h100,h100-96gb,a100-80gb,a100-40gb,h200,h800,b200,b300,gb200,gb300,mi300x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DEFAULT_RUNS if DEFAULT_RUNS.exists() else "/work/shared/data/published_runs.csv"))
    ap.add_argument("--loso", default=None, help="held-out predictions CSV (benchmarks/validate.py --output)")
    ap.add_argument("--gpus", default=GPUS)
    ap.add_argument("--output", default=str(BAND_FILE))
    ap.add_argument("--check", action="store_true", help="print coverage, write nothing")
    args = ap.parse_args()
    if args.loso:
        pred = pd.read_csv(args.loso)
    else:
        from autoparallel.validation.loso import loso_predictions
        from autoparallel.validation.runs import load_cases

        cases, _ = load_cases(read_runs(args.runs))
        pred, _ = loso_predictions(cases, [g for g in args.gpus.split(",") if g])
    res = residual_frame(pred)
    from autoparallel.data import MEMORY_RUNS
    from autoparallel.validation.memory_check import memory_records

    records, _ = memory_records(read_runs(MEMORY_RUNS))
    mem = memory_residual_frame(records)
    rows = band_rows(res, mem)
    pd.set_option("display.width", 200)
    print(pd.DataFrame([r.__dict__ for r in rows]).to_string(index=False), "\n")
    cov = coverage(res, rows)
    res["group"] = res["gpu"].map(lambda g: "a100" if g.startswith("a100") else g)
    cov["group"] = res["group"]
    fmt = {"inside_shipped": "{:.0%}".format, "inside_nested": "{:.0%}".format}
    print("== coverage of the p10-p90 band (target 80 %) per GPU group")
    print(coverage_summary(cov, "group").to_string(index=False, formatters=fmt), "\n")
    print("== per source")
    print(coverage_summary(cov, "source").to_string(index=False, formatters=fmt), "\n")
    mcov = memory_coverage(res, mem, rows)
    print(f"== memory: share of {mcov['runs']} runs with measured <= total_high (exp(-p10)): "
          f"{mcov['covered_shipped']:.0%} shipped, {mcov['covered_nested']:.0%} nested\n")
    print("== per regime")
    print(coverage_summary(cov, "regime").to_string(index=False, formatters=fmt), "\n")
    if not args.check:
        header = ("Error bands: p10 / p50 / p90 of ln(predicted / measured) from leave-one-source-out\n"
                  f"validation residuals ({len(res)} runs of {Path(args.runs).name}); memory rows\n"
                  f"also from the {len(mem)} dense runs of memory_runs.csv (no fitted memory knobs).\n"
                  "Written by benchmarks/error_bands.py; read by autoparallel/bands.py.")
        write_table(rows, args.output, header)
        print(f"table -> {args.output}")


if __name__ == "__main__":
    main()
